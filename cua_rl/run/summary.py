"""What the launcher prints when a run ends: where its logs, checkpoints and statistics are, the policy
endpoints' and episodes' counts, a failed run's cause and recover point, and the last rewards seen.

Why a module of its own: all of it reads what the run left on disk after the trainer exited (the trainer's
``train.log``, the rollout workers' ``policy_endpoint/*.json`` counts, the tensorboard event files, the
checkpoints' recover point), none of it decides how a run starts (``launch.py``). The event files are read
without TensorFlow (TFRecord framing plus tensorboardX's ``Event`` proto).
"""

from __future__ import annotations

import json
import logging
import re
import signal
import struct
from pathlib import Path

from cua_rl.trainer.health import STOP_MARK, UnhealthyRun
from cua_rl.trainer.model_watch import GONE_RE
from cua_rl.trainer.resume import settle
from cua_rl.run.console import ANSI, TABLE_START
from cua_rl.runs import RunPaths, host_counts, read_counts

logger = logging.getLogger("cua_rl.run.summary")


def read_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars from tensorboard event files (TFRecord framing + tensorboardX's Event proto; no TF needed)."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(tb_dir.glob("**/events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            record = data[pos + 12: pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event.FromString(record)
            for v in event.summary.value:
                scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
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


def print_summary(paths: RunPaths, elapsed: float, rc: int, stopped_by: int | None = None) -> None:
    """What the run did; ``stopped_by``: the signal that asked the launcher to stop it (not a failure)."""
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
    for line in host_lines(totals):
        print(line)
    saved = paths.checkpoints.is_dir() and any(p.is_file() for p in paths.checkpoints.rglob("*"))
    print(f"[cua-rl] checkpoints: {paths.checkpoints}" + ("" if saved else "  (none written: see saver.freq_steps)"))
    if rc != 0:
        cause = None if stopped_by else failure_cause(paths.logs / "train.log")
        if cause:
            print(f"[cua-rl] cause:       {cause}")
        point = settle(paths.checkpoints) if paths.checkpoints.is_dir() else None   # the trainer is gone
        if point is not None:
            print(f"[cua-rl] recover point: after step {point['global_step'] + 1}; continue this run with: "
                  f"train.sh --resume trial_name={paths.checkpoints.name} (and the same other arguments)")
    print(f"[cua-rl] statistics:  {paths.tensorboard}  (tensorboard event files)")
    try:
        scalars = read_scalars(paths.tensorboard)
    except Exception as exc:  # a summary must never hide the run's own exit code
        print(f"[cua-rl] (could not read statistics: {exc})")
        return
    wanted = ("rollout/reward", "rollout/task_success", "eval-rollout/reward", "eval-rollout/task_success")
    for tag in (t for t in wanted if t in scalars):
        print(f"[cua-rl]   {tag}: {by_step(scalars[tag])}")


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


def by_step(points: list[tuple[int, float]]) -> str:
    """``steps 1-24: 0.781 0.833 - ...``: AReaL's 0-based global steps numbered as the console numbers them,
    '-' for a step without the statistic."""
    values = dict(points)
    first, last = min(values), max(values)
    return f"steps {first + 1}-{last + 1}: " + " ".join(
        f"{values[s]:.3f}" if s in values else "-" for s in range(first, last + 1))
