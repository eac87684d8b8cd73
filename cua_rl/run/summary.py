"""What the launcher prints when a run ends: where its logs, checkpoints (the final one by name) and statistics
are, the policy endpoints' and episodes' counts, a failed run's cause and recover point, each step's success
and reward, how the step numbers of the console, AReaL, the checkpoints and the monitor map, and a verdict on
learning when one was written. Every command it prints works from a fresh shell (full paths).

Why a module of its own: all of it reads what the run left on disk after the trainer exited (the trainer's
``train.log``, the rollout workers' ``policy_endpoint/*.json`` counts, ``metrics.jsonl``, the checkpoints and
their recover point, ``verdict.json``), none of it decides how a run starts (``launch.py``). ``read_scalars``
gives every statistic the run committed, by step, from ``metrics.jsonl`` (the same values AReaL's stats logger
got), for the tests and benches that check what AReaL logged.
"""

from __future__ import annotations

import json
import logging
import re
import signal
from pathlib import Path

from cua_rl.run.console import ANSI, TABLE_START
from cua_rl.runs import RunPaths, host_counts, read_counts
from cua_rl.trainer.health import STOP_MARK, UnhealthyRun
from cua_rl.trainer.model_watch import GONE_RE
from cua_rl.trainer.progress import METRICS, read_metrics
from cua_rl.trainer.resume import settle

logger = logging.getLogger("cua_rl.run.summary")


def read_scalars(logs: Path) -> dict[str, list[tuple[int, float]]]:
    """Each statistic the run committed, as ``(global_step, value)`` in step order, from the run's
    ``metrics.jsonl`` in its log directory ``logs`` (the values AReaL's stats logger got for TensorBoard)."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(logs):
        step = record.get("global_step")
        for key, value in record.items():
            if key not in ("step", "global_step", "policy_version") and isinstance(value, (int, float)):
                scalars.setdefault(key, []).append((step, float(value)))
    return scalars


def show_tail(log_file: Path, lines: int = 40) -> None:
    """A failed trainer's last lines, which the quiet console kept back (the traceback is usually there);
    AReaL's statistics tables are left out (a trainer killed after a step ends its log with one)."""
    try:
        text = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return
    tail = [line for line in text if not ANSI.sub("", line).strip().startswith(TABLE_START)][-lines:]
    print(f"[cua-rl] the trainer failed; the last {len(tail)} lines of {log_file} (statistics tables left out):")
    for line in tail:
        print("  " + ANSI.sub("", line))


def endpoint_totals(logs: Path) -> dict[str, int]:
    """The policy endpoints' turn counts and the workflows' episode counts (evaluated, lost by cause, groups
    rejected), summed over rollout workers."""
    return read_counts(logs)


# AReaL's trainer calling its inference server (vLLM/SGLang) and finding nobody there: the server died.
_ENGINE_GONE = re.compile(r"Engine method '(\w+)' failed: .*Addr: (\S+?)\. .*(?:ConnectionRefused|ClientConnectorError)")


_LOST = "it exited or was killed; see rollout.log. The episodes in flight were lost, not scored."


def failure_cause(train_log: Path) -> str | None:
    """A failed run's cause in one sentence, when ``train.log`` shows one we know; else None."""
    try:
        text = train_log.read_text(errors="replace")
    except OSError:
        return None
    health = re.search(rf"{STOP_MARK} after step \d+: ([^\n]*?); the last recover point", text)
    if health:   # the trainer's health checks stopped the run (cua_rl/trainer/health.py)
        lines = re.findall(r"^\[cua-rl\] health step \d+: (\S+) .*$", text, re.M)
        return (f"a health check stopped the run: {health.group(1)}" +
                (f" (the console's '[cua-rl] health' lines say the likely cause; {len(lines)} in train.log)"
                 if lines else ""))
    watched = GONE_RE.search(text)   # cua_rl.trainer.model_watch stopped the run
    if watched:
        return f"{watched.group(0)}: {_LOST}"
    gone = _ENGINE_GONE.search(text)
    if gone:
        return (f"the model server at {gone.group(2)} stopped answering (connection refused when the trainer "
                f"called {gone.group(1)}): {_LOST}")
    return None


CKPT = re.compile(r"^epoch(\d+)epochstep(\d+)globalstep(\d+)$")
VERDICT = "verdict.json"   # in the run's log directory: {"summary": "...", "lines": ["...", ...]} (other keys ignored)


def final_checkpoint(checkpoints: Path) -> Path | None:
    """The newest model checkpoint AReaL's saver wrote (``<root>/default/epoch{E}epochstep{S}globalstep{G}``,
    the highest G holding a ``config.json``), or None."""
    found = []
    for d in checkpoints.glob("*/epoch*epochstep*globalstep*"):
        m = CKPT.match(d.name)
        if m and (d / "config.json").is_file():
            found.append((int(m.group(3)), d))
    return max(found)[1] if found else None


def fault_lines(totals: dict[str, int]) -> list[str]:
    """The gym faults the agent recovered from (counted, the episodes trained) and, for a gym that sends no
    ``faults``, its episodes' failed runs by kind: trained as the policy's, since nothing told the gym's
    failures apart (docs/protocols.md 1.4)."""
    lines = []
    if totals.get("episodes_gym_faults_recovered"):
        lines.append(f"[cua-rl] gym faults:  {totals.get('gym_faults_recovered', 0)} recovered from in "
                     f"{totals['episodes_gym_faults_recovered']} evaluated episodes (the agent went on past them; "
                     f"counted, not dropped)")
    if totals.get("episodes_gym_without_faults"):
        prefix = "episodes_gym_without_faults_failed_"
        kinds = {k[len(prefix):]: v for k, v in sorted(totals.items()) if k.startswith(prefix) and v}
        lines.append(f"[cua-rl] WARNING: {totals['episodes_gym_without_faults']} evaluated episodes on a gym that "
                     f"sends no faults (docs/protocols.md 1.4); their failed runs by kind: "
                     f"{', '.join(f'{k} {v}' for k, v in kinds.items()) or 'none'}; trained as the policy's, "
                     f"since nothing told the gym's failures apart")
    return lines


def print_summary(paths: RunPaths, elapsed: float, rc: int, stopped_by: int | None = None,
                  train_command: str = "train.sh") -> None:
    """What the run did; ``stopped_by``: the signal that asked the launcher to stop it (not a failure);
    ``train_command``: how to start the launcher from a fresh shell (the resume hint)."""
    outcome = ("finished" if rc == 0 else f"stopped by {signal.Signals(stopped_by).name}" if stopped_by
               else f"STOPPED by a health check (exit code {rc})" if rc == UnhealthyRun.CODE
               else f"FAILED (exit code {rc})")
    print(f"\n[cua-rl] training {outcome} in {elapsed:.0f} s")
    workers = ("rollout.log: rollout worker and vLLM; actor.log" if (paths.logs / "rollout.log").exists() else
               "under Ray, the workers' and vLLM's output too, each line tagged with its Ray actor")
    print(f"[cua-rl] logs:        {paths.logs}  (train.log; {workers})")
    totals = endpoint_totals(paths.logs)
    if totals:
        print(f"[cua-rl] policy endpoint: {totals.get('verified_turns', 0)} turns with prompt ids verified "
              f"against the engine, {totals.get('prompt_mismatches', 0)} mismatches refused, "
              f"{totals.get('straddles', 0)} interrupted outputs and "
              f"{totals.get('vision_token_outputs', 0)} with vision placeholder tokens regenerated, "
              f"{totals.get('failed_turns', 0)} failed turns, {totals.get('undelivered_turns', 0)} answers the agent "
              f"never received (not recorded); {totals.get('recorded_turns', 0)} turns recorded")
        if totals.get("unproved_vllm_turns", 0):
            print(f"[cua-rl] WARNING: {totals['unproved_vllm_turns']} turns were recorded on vLLM without their prompt "
                  f"ids proved (policy.require_prompt_proof=false): verified turns != recorded turns")
    if "episodes_evaluated" in totals:
        causes = ", ".join(f"{k[len('episodes_lost_'):].replace('_', ' ')} {v}" for k, v in sorted(totals.items())
                           if k.startswith("episodes_lost_") and v)
        print(f"[cua-rl] episodes:    {totals['episodes_evaluated']} evaluated, {totals.get('episodes_lost', 0)} lost to "
              f"infrastructure failures (gym, agent service or model server: never given a reward"
              f"{'; ' + causes if causes else ''}), "
              f"{totals.get('groups_rejected', 0)} groups rejected for too few evaluated episodes")
        for line in fault_lines(totals):
            print(line)
    for line in host_lines(totals):
        print(line)
    final = final_checkpoint(paths.checkpoints) if paths.checkpoints.is_dir() else None
    print(f"[cua-rl] checkpoints: {paths.checkpoints}" + ("" if final else "  (none written: see saver.freq_steps)"))
    if final is not None:
        print(f"[cua-rl] final checkpoint: {final}  (Hugging Face format with its processor; serve it with vLLM: "
              f"docs/policy-and-training.md, \"Serving and exporting a checkpoint\")")
    if rc != 0:
        cause = None if stopped_by else failure_cause(paths.logs / "train.log")
        if cause:
            print(f"[cua-rl] cause:       {cause}")
        point = settle(paths.checkpoints) if paths.checkpoints.is_dir() else None   # the trainer is gone
        if point is not None:
            print(f"[cua-rl] recover point: after step {point['global_step'] + 1}; continue this run with: "
                  f"{train_command} --resume trial_name={paths.checkpoints.name} (and the same other arguments)")
    print_steps(read_metrics(paths.logs), paths.logs)
    print_verdict(paths.logs)


def print_steps(records: list[dict], logs: Path) -> None:
    """Each trained step's sampled success and reward (``metrics.jsonl``), and how the step numbers map."""
    print(f"[cua-rl] statistics:  {logs / METRICS}  (one JSON line per step: the trained episodes' outcome, "
          f"every AReaL statistic; TensorBoard event files in {logs / 'tensorboard'})")
    steps = {r["step"]: r for r in records if isinstance(r.get("step"), int)}
    if not steps:
        return
    success, reward = by_step(steps, "trained/success"), by_step(steps, "trained/reward")
    if success == reward:   # a 0/1 reward: one line says both
        print(f"[cua-rl]   success of the episodes each step trained (sampled): {success} (the reward the same)")
    else:
        print(f"[cua-rl]   success of the episodes each step trained (sampled): {success}")
        print(f"[cua-rl]   reward of the episodes each step trained (sampled): {reward}")
    last = max(steps)
    print(f"[cua-rl] numbering:   console step N = AReaL global_step N-1 = checkpoint ...globalstep{{N-1}} = "
          f"monitor step (policy version) N-1, which step N turned into version N (step {last}: globalstep{last - 1})")


def by_step(steps: dict[int, dict], key: str) -> str:
    """``steps 1-16: 0.781 0.833 - ...``: '-' for a step without the value."""
    first, last = min(steps), max(steps)
    return f"steps {first}-{last}: " + " ".join(
        f"{steps[s][key]:.3f}" if s in steps and key in steps[s] else "-" for s in range(first, last + 1))


def print_verdict(logs: Path) -> None:
    """The run's verdict on learning, when something wrote one into its log directory (``VERDICT``)."""
    path = logs / VERDICT
    if not path.is_file():
        return
    try:
        verdict = json.loads(path.read_text())
        lines = [str(verdict["summary"]), *(str(line) for line in verdict.get("lines", []))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"[cua-rl] verdict:     unreadable {path}: {type(exc).__name__}: {exc}")
        return
    print(f"[cua-rl] verdict:     {lines[0]}")
    for line in lines[1:]:
        print(f"[cua-rl]   {line}")


def host_lines(totals: dict[str, int]) -> list[str]:
    """With several gym hosts: the episodes each served, and one line per drained host with its counts."""
    hosts = host_counts(totals)
    if len(hosts) < 2 and not any(c.get("drains") for c in hosts.values()):
        return []
    lines = ["[cua-rl] gym hosts:   " + ", ".join(f"{url} {c.get('episodes', 0)} episodes"
                                                    for url, c in sorted(hosts.items()))]
    for url, c in sorted(hosts.items()):
        if c.get("drains") or c.get("groups_drained"):
            lines.append(f"[cua-rl] gym host drained: {url} ({c.get('drains', 0)}x): {c.get('groups_drained', 0)} "
                         f"groups with {c.get('episodes_drained', 0)} episodes in flight there dropped, never trained, "
                         f"and played again on other hosts; {c.get('episodes', 0)} episodes evaluated there")
    return lines
