"""The run's health, step by step: invariants over what a step already records, and a clean stop on garbage.

Why: a run can look alive while it learns from nothing: an agent on another host that cannot reach the policy
endpoint makes every episode "evaluated" with 0 policy turns; a gym under load fails actions; the prompt proof
switched off lets turns train whose prompt ids nobody checked. Each invariant below is computed after every
step from AReaL's exported statistics (the workflow records per-episode and per-group indicators for them,
``cua_rl.workflow.group``), compared with a threshold, and either stops the run or warns:

- ``stop``: the step's data is garbage. The step's statistics are committed first and its recover point is
  already written (AReaL saves it before the statistics), so ``train.sh --resume`` continues after the fix.
- ``warn``: one ``[cua-rl] health`` line on the console, the values in the statistics as ``health/<name>``.

Between steps, ``StallWatch`` covers the cases no step statistics can show. It reads the workflows' running
counts (``cua_rl.runs.read_counts``):
- every episode lost, so every group is rejected and AReaL waits for a batch that never comes (an agent that
  cannot reach the policy endpoint does exactly this): when two steps' worth of episodes were lost and none
  evaluated for ``health.stall_seconds``, it acts as ``infra_lost_share`` does;
- nothing ends at all (a model server that hangs: no request fails, no episode ends, and AReaL's own
  timeouts wait 600 s or for ever): when no group ended since the last one or the last step for
  ``idle_seconds`` (30 minutes), it acts as that invariant says.

``health.on_anomaly`` (``--on-anomaly``): ``default`` (each invariant's own action, the table in
docs/health.md), ``stop`` or ``warn`` for all. ``health.thresholds`` overrides any threshold by name.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cua_rl.areal_ext import SAMPLER_GAP_KEY  # recorded by cua_rl.areal_ext.trainer_logprobs in the training worker
from cua_rl.runs import DropCause, read_counts

logger = logging.getLogger(__name__)

ACTIONS = ("default", "stop", "warn")
# printed by the trainer when it stops a run; cua_rl.run.summary finds it in train.log for the summary's cause
STOP_MARK = "HEALTH STOP"


@dataclass(frozen=True)
class Invariant:
    name: str
    action: str          # the default: "stop" (garbage) or "warn"
    threshold: float     # trips when the value is above it (``at_least``: at or above it)
    what: str            # the value, in words
    cause: str           # the likely cause
    check: str           # what to look at
    steps: int = 1       # consecutive steps it must trip before it acts
    at_least: bool = False


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("no_policy_turn_share", "stop", 0.5,
              "share of evaluated episodes in which the agent called the policy endpoint 0 times",
              "the agent service cannot reach the policy endpoint (it calls the URL it was given each episode)",
              "the agent's log for the model URL it called; policy.bind_host / --policy-host (the address the "
              "endpoint advertises must route from the agent's host); a firewall between them"),
    Invariant("infra_lost_share", "stop", 0.5,
              "share of episodes lost to the gym, the agent service or the model server (never scored)",
              "a service keeps failing: the gym (capacity, crashes), the agent service, or the model server",
              "the summary's lost-by-cause counts and the named service's log; rollout.log (for 'policy "
              "unreached': the URL the agent was told, and whether it routes from the agent's host)", steps=2),
    Invariant("unproved_vllm_turns", "stop", 0.0,
              "turns per episode recorded on vLLM without their prompt ids proved against the engine",
              "policy.require_prompt_proof=false: the trained prompt may not be the one vLLM generated from",
              "turn the proof back on (policy.require_prompt_proof=true); see docs/protocols.md, the prompt proof"),
    Invariant("sampler_logprob_gap", "warn", 0.05,
              "mean |trainer - engine| logprob of the trained tokens sampled at the trainer's version (about 1e-6 "
              "on the CPU in float32; bf16 on a GPU is noisier)",
              "the engine samples with other weights than the trainer's (a weight update that never reached it, "
              "another model) or scores other inputs (an image or prompt the trainer does not see)",
              "rollout.log for the weight loads of every step; that vLLM and the actor load the same model "
              "(actor.path); the Training Monitor colours each token by this gap"),
    Invariant("weights_unchanged", "stop", 0.0,
              "model servers serving the same prompt logprobs of a fixed canary after a weight update whose "
              "optimizer step was real as before it (probed after the update: cua_rl/trainer/weight_probe.py)",
              "the model server acknowledged the update but serves its old weights: every later output is "
              "sampled from the old policy under the new version's label",
              "rollout.log for the server's weight loads; the server's log around the update; "
              "vllm.worker_extension_cls; with LoRA, that the engine applies the adapter"),
    Invariant("zero_variance_group_share", "warn", 1.0,
              "share of GRPO groups whose episodes all got the same reward (no learning signal)",
              "tasks too easy or too hard for the policy, or a reward that does not depend on the episode",
              "rollout/reward per task; the task source's difficulty", at_least=True, steps=3),
    Invariant("truncated_output_share", "warn", 0.5,
              "share of the policy's outputs the engine cut at gconfig.max_new_tokens",
              "gconfig.max_new_tokens too small for the agent's reply format",
              "a few replies in the Training Monitor; raise gconfig.max_new_tokens"),
    Invariant("staleness", "warn", -1.0,
              "most policy versions between a trained token's sampling and the update (ppo_actor version stats)",
              "rollouts older than rollout.max_head_offpolicyness allows",
              "rollout.max_head_offpolicyness and the rollout/train balance"),
    Invariant("lost_length_skew", "warn", 0.2,
              "share of long episodes (at least half of max_turns played) lost minus the share of short ones lost",
              "drops that grow with episode length (gym faults or slow steps under load, the model server on long "
              "prompts): the long, mostly failing episodes leave their groups' baselines and the rest is trained "
              "as if they had not happened (survivorship)",
              "the summary's lost-by-cause counts and the named service's log; rollout/lost_long and "
              "rollout/lost_short; the gym's load (gym_fleet, --pool-size)", steps=3),
    Invariant("at_max_turns_share", "warn", 1.0,
              "share of evaluated episodes that ended at max_turns",
              "the agent never finishes: max_turns too small, or the policy never answers 'done'",
              "a few episodes in the Training Monitor; max_turns", at_least=True, steps=3),
    Invariant("idle_seconds", "stop", 1800.0,
              "seconds in which no group of episodes ended (evaluated or lost, training or evaluation) since the "
              "last one or the last step (checked between steps by the stall watch)",
              "a service that hangs without failing: a model server that stopped answering (vLLM's multimodal "
              "cache desync once hung its engine), a gym whose creates never return, an agent that never ends "
              "an episode",
              "rollout.log for the last finished group; the model server's log for its last request; py-spy "
              "dump of the rollout worker; a step that trains longer than this needs a larger "
              "health.thresholds.idle_seconds (+health.thresholds.idle_seconds=N)"),
    Invariant("success_stuck_steps", "warn", 10.0,
              "consecutive steps whose rollout success was exactly 0 or exactly 1",
              "the task set gives no contrast (all solved or none), so GRPO has nothing to learn from",
              "the task source's difficulty; rollout/task_success", at_least=True),
)
BY_NAME = {inv.name: inv for inv in INVARIANTS}


@dataclass
class HealthConfig:
    """``health`` in the config: what an anomaly does and the thresholds (defaults in ``INVARIANTS``)."""

    on_anomaly: str = field(default="default", metadata={
        "help": "What a failed health check does: default (each invariant's own action: stop on garbage, warn "
                "otherwise; docs/health.md), stop or warn.",
        "choices": list(ACTIONS)})
    thresholds: dict[str, float] = field(default_factory=dict, metadata={
        "help": "Thresholds by invariant name instead of their defaults, e.g. +health.thresholds.infra_lost_share=0.8 "
                "(names and defaults: docs/health.md)."})
    stall_seconds: float = field(default=60.0, metadata={
        "help": "StallWatch: how long no episode may be evaluated while two steps' worth are lost before it acts "
                "(longer than the model-server watch's 15 s grace, which names a dead vLLM more precisely)"})
    weight_probe: bool = field(default=True, metadata={
        "help": "Probe each inference server after every weight update (the weights_unchanged check, "
                "cua_rl/trainer/weight_probe.py); false skips it."})

    def __post_init__(self):
        if self.on_anomaly not in ACTIONS:
            raise ValueError(f"health.on_anomaly must be one of {ACTIONS}, got {self.on_anomaly!r}")
        if self.stall_seconds <= 0:
            raise ValueError(f"health.stall_seconds must be positive, got {self.stall_seconds}")
        unknown = sorted(set(self.thresholds or {}) - set(BY_NAME))
        if unknown:
            raise ValueError(f"health.thresholds: unknown invariants {unknown}; known: {sorted(BY_NAME)}")


@dataclass(frozen=True)
class Finding:
    step: int
    invariant: Invariant
    value: float
    threshold: float
    action: str
    note: str = ""       # what the value is made of, when it says more than the value

    def as_dict(self) -> dict:
        """For the Training Monitor's run page (``cua_rl.monitor.records.update_record``)."""
        return {"name": self.invariant.name, "value": self.value, "threshold": self.threshold,
                "action": self.action, "line": self.line()}

    def line(self) -> str:
        inv = self.invariant
        return (f"[cua-rl] health step {self.step}: {inv.name} {self.value:.3g} "
                f"({'>=' if inv.at_least else '>'} {self.threshold:g}; {self.action}): {inv.what}"
                f"{' (' + self.note + ')' if self.note else ''}. Likely cause: {inv.cause}. Check: {inv.check}")


def _get(stats: dict[str, float], key: str) -> float | None:
    value = stats.get(key)
    return None if value is None else float(value)


class Health:
    """Feed it each step's statistics (``observe``); it returns what tripped and adds ``health/*`` values."""

    def __init__(self, config: HealthConfig, *, max_turns: int, max_head_offpolicyness: int,
                 policy_endpoint: bool = True) -> None:
        self.config = config
        self.max_turns = max_turns
        self.policy_endpoint = policy_endpoint   # False: the agent calls another model, nothing is recorded
        self.thresholds = {inv.name: float(config.thresholds.get(inv.name, inv.threshold)) for inv in INVARIANTS}
        if "staleness" not in config.thresholds:
            self.thresholds["staleness"] = float(max_head_offpolicyness + 1)
        self._streak: dict[str, int] = {}
        self._stuck = 0

    def action(self, inv: Invariant) -> str:
        """What tripping ``inv`` does under ``health.on_anomaly``."""
        return inv.action if self.config.on_anomaly == "default" else self.config.on_anomaly

    def values(self, stats: dict[str, float]) -> dict[str, float]:
        """This step's value of every invariant it has the statistics for."""
        out: dict[str, float] = {}
        if self.policy_endpoint:
            for name, key in (("no_policy_turn_share", "rollout/no_policy_turn"),
                              ("unproved_vllm_turns", "rollout/unproved_vllm_turns")):
                if (v := _get(stats, key)) is not None:
                    out[name] = v
        for name, key in (("sampler_logprob_gap", SAMPLER_GAP_KEY),
                          ("infra_lost_share", "rollout/episode_lost"),
                          ("zero_variance_group_share", "rollout/zero_reward_variance"),
                          ("truncated_output_share", "rollout/truncated_turns"),
                          ("staleness", "ppo_actor/update/version_stats/sample_staleness_theta_max")):
            if (v := _get(stats, key)) is not None:
                out[name] = v
        if self.max_turns > 1 and (v := _get(stats, "rollout/at_max_turns")) is not None:
            out["at_max_turns_share"] = v
        long, short = _get(stats, "rollout/lost_long"), _get(stats, "rollout/lost_short")
        if self.max_turns > 1 and long is not None and short is not None:
            out["lost_length_skew"] = long - short
        success = _get(stats, "rollout/task_success")
        if success is not None:
            self._stuck = self._stuck + 1 if success in (0.0, 1.0) else 0
            out["success_stuck_steps"] = float(self._stuck)
        return out

    def judge(self, step: int, name: str, value: float, note: str = "") -> Finding | None:
        """One value measured outside the step's statistics (the weight probe's, after the commit)."""
        inv, limit = BY_NAME[name], self.thresholds[name]
        tripped = value >= limit if inv.at_least else value > limit
        return Finding(step, inv, value, limit, self.action(inv), note=note) if tripped else None

    def observe(self, step: int, stats: dict[str, float]) -> list[Finding]:
        """Checks one step (1-based); adds ``health/<name>`` for each value to ``stats``."""
        findings = []
        for name, value in self.values(stats).items():
            stats[f"health/{name}"] = value
            inv, limit = BY_NAME[name], self.thresholds[name]
            tripped = value >= limit if inv.at_least else value > limit
            self._streak[name] = self._streak.get(name, 0) + 1 if tripped else 0
            if self._streak[name] >= inv.steps:
                findings.append(Finding(step, inv, value, limit, self.action(inv)))
        stats["health/anomalies"] = float(len(findings))
        return findings


_STOP_REQUESTED = threading.Event()


def log_stop(last_step: int, findings: list[Finding]) -> None:
    """The line the launcher's summary quotes as the cause (cua_rl.run.summary.failure_cause)."""
    what = ", ".join(f"{f.invariant.name} {f.value:.3g} (threshold {f.threshold:g})" + (f": {f.note}" if f.note else "")
                     for f in findings)
    logger.error("%s after step %d: %s; the last recover point is kept (train.sh --resume continues the run); "
                 "--on-anomaly warn runs on regardless", STOP_MARK, last_step, what)


def stop_requested() -> bool:
    """Whether a health check asked this process to stop (train.py exits with ``UnhealthyRun.CODE`` then)."""
    return _STOP_REQUESTED.is_set()


class StallWatch:
    """See the module docstring. ``step_done()`` after each committed step resets the count."""

    def __init__(self, logs: Path, health: Health, *, episodes_per_step: int, stall_s: float | None = None,
                 interval_s: float = 5.0, on_stop: Callable[[], None] | None = None,
                 read: Callable[[Path], dict[str, int]] | None = None,
                 on_finding: Callable[[Finding], None] | None = None,
                 read_all: Callable[[Path], dict[str, int]] | None = None) -> None:
        self.logs, self.health = Path(logs), health
        self.min_lost = 2 * episodes_per_step
        self.stall_s = health.config.stall_seconds if stall_s is None else stall_s
        self.interval_s = interval_s
        self.on_stop = on_stop or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.on_finding = on_finding or (lambda finding: None)   # the run page hears of it too
        self._read = read or (lambda logs: read_counts(logs, "train"))
        self._read_all = read_all or (lambda logs: read_counts(logs))   # training and evaluation groups
        self.step = 1
        self._since = self._counts()
        self._last_evaluated_at = time.monotonic()
        self._ended, self._last_ended_at = self._groups_ended(), time.monotonic()
        self._told = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-stall-watch", daemon=True)

    def _counts(self) -> tuple[int, int, dict[str, int]]:
        totals = self._read(self.logs)
        causes = {k.removeprefix("episodes_lost_"): v for k, v in totals.items() if k.startswith("episodes_lost_")}
        return totals.get("episodes_evaluated", 0), totals.get("episodes_lost", 0), causes

    def start(self) -> "StallWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _groups_ended(self) -> int:
        totals = self._read_all(self.logs)
        return sum(totals.get(k, 0) for k in ("episodes_evaluated", "episodes_lost"))

    def step_done(self, step: int) -> None:
        self.step = step + 1
        self._since = self._counts()
        self._last_evaluated_at = time.monotonic()
        self._ended, self._last_ended_at = self._groups_ended(), time.monotonic()
        self._told = False

    def check(self) -> Finding | None:
        """One look: a finding when the run has stalled on lost episodes or on nothing ending at all (see the
        module docstring)."""
        return self._lost_check() or self._idle_check()

    def _idle_check(self) -> Finding | None:
        ended = self._groups_ended()
        if ended != self._ended:
            self._ended, self._last_ended_at = ended, time.monotonic()
            return None
        inv, idle = BY_NAME["idle_seconds"], time.monotonic() - self._last_ended_at
        if idle <= self.health.thresholds[inv.name]:
            return None
        return Finding(self.step, inv, idle, self.health.thresholds[inv.name], self.health.action(inv),
                       note=f"no episode evaluated or lost for {idle:.0f} s: step {self.step} waits for rollouts "
                            f"that neither finish nor fail")

    def _lost_check(self) -> Finding | None:
        evaluated, lost, causes = self._counts()
        if evaluated > self._since[0]:
            self._since, self._last_evaluated_at = (evaluated, lost, causes), time.monotonic()
            return None
        new_lost = lost - self._since[1]
        if new_lost < self.min_lost or time.monotonic() - self._last_evaluated_at < self.stall_s:
            return None
        inv = BY_NAME["infra_lost_share"]
        by_cause = ", ".join(f"{c.replace('_', ' ')} {v - self._since[2].get(c, 0)}" for c, v in sorted(causes.items())
                             if v > self._since[2].get(c, 0))
        unreached = (causes.get(DropCause.POLICY_UNREACHED, 0)
                     - self._since[2].get(DropCause.POLICY_UNREACHED, 0))
        hint = ("; the agent cannot reach the policy endpoint at the URL it is given (rollout.log names it)"
                if unreached * 2 > new_lost else "")
        return Finding(self.step, inv, 1.0, self.health.thresholds[inv.name], self.health.action(inv),
                       note=f"{new_lost} episodes lost ({by_cause}) and none evaluated for "
                            f"{time.monotonic() - self._last_evaluated_at:.0f} s: step {self.step} cannot "
                            f"complete{hint}")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            finding = self.check()
            if finding is None or self._told:
                continue
            self._told = True
            print(finding.line(), flush=True)
            self.on_finding(finding)
            if finding.action == "stop":
                log_stop(self.step - 1, [finding])
                _STOP_REQUESTED.set()
                self.on_stop()
                return


class UnhealthyRun(SystemExit):
    """Raised by the trainer after a step whose health says stop; exit code 3."""

    CODE = 3

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__(self.CODE)
        self.findings = findings
