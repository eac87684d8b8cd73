"""Soak benchmark: the embedded default (``train.sh`` with no ``--gym``) for a long time; prints one JSON object.

What it reports, from outside the run (``/proc`` and the run's own files):
  - the resident memory (RSS, MiB) of each process of the run, grouped by role (launcher with the embedded
    gym and agent service, trainer, training and rollout workers, vLLM, desktops: Xvfb and their apps), once
    the first step is done (warm) and at the end, with the growth in percent per role; the growth of the
    persistent processes in all (desktops come and go with the episodes in flight), and their total each
    minute;
  - episodes evaluated and lost (the workflow's counts, as the summary prints them), steps done;
  - what is left running after the run is stopped with Ctrl-C (SIGINT): desktops (Xvfb), vLLM, and any
    other process of the run: all must be 0.

  python bench/soak_bench.py --minutes 60            # the issue's soak: 1 hour after the first step
  python bench/soak_bench.py --minutes 5 --out x.json

It owns the machine while it runs (vLLM, the trainer and the desktops use both cores): run nothing beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from miniwob_bench import tree

ROOT = Path(__file__).resolve().parents[1]
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def role(pid: int) -> str | None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    for pattern, name in ((r"areal_vllm_server|vllm", "vllm"), (r"cua_rl\.run\.launch", "launcher (gym, agent service)"),
                          (r"cua_rl\.areal_ext\.worker|rpc_server", "workers"), (r"cua_rl\.train ", "trainer"),
                          (r"^Xvfb|openbox|bwrap|mousepad|pcmanfm|xterm|dbus|chromium|wish", "desktops")):
        if re.search(pattern, cmd):
            return name
    return "other"


def rss_mib(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KIB / 1024
    except (OSError, IndexError, ValueError):
        return 0.0


def memory(launcher: int) -> dict[str, dict]:
    by_role: dict[str, dict] = {}
    for pid in tree(launcher) | {launcher}:   # desktops run in their own sessions but stay descendants
        name = role(pid)
        if name is None:
            continue
        entry = by_role.setdefault(name, {"processes": 0, "rss_mib": 0.0})
        entry["processes"] += 1
        entry["rss_mib"] = round(entry["rss_mib"] + rss_mib(pid), 1)
    return by_role


def episode_counts(fileroot: Path) -> dict[str, int]:
    """The workflow's episode counts, summed as the run's summary sums them."""
    from cua_rl.run.summary import endpoint_totals

    totals: dict[str, int] = {}
    for logs in fileroot.glob("logs/*/*/*/policy_endpoint"):
        for k, v in endpoint_totals(logs.parent).items():
            totals[k] = totals.get(k, 0) + v
    return {k: totals.get(k, 0) for k in ("episodes_evaluated", "episodes_lost", "groups_rejected")}


def steps_done(out: Path) -> int:
    return max((int(n) for n in re.findall(r"\[cua-rl\] step (\d+)/", out.read_text(errors="replace"))), default=0)


def pids(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="soak length after the first step")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("overrides", nargs="*", help="extra train.sh arguments (Hydra overrides)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    env = {**os.environ, "CUA_RL_FILEROOT": str(work / "fileroot")}
    env.pop("GYM_BASE_URL", None)
    xvfb_before, vllm_before = pids("^Xvfb"), pids("areal_vllm_server")
    out = work / "train.out"
    proc = subprocess.Popen(["bash", str(ROOT / "examples/cua_agent/train.sh"), "total_train_steps=100000",
                             "trial_name=soak", *args.overrides], cwd=ROOT, env=env, stdout=open(out, "w"),
                            stderr=subprocess.STDOUT)
    result: dict = {"bench": "soak", "minutes": args.minutes, "work_dir": str(work)}
    end_pids: set[int] = set()
    samples: list[float] = []
    try:
        t0 = time.monotonic()
        while steps_done(out) < 1:
            if proc.poll() is not None:
                raise SystemExit(f"the run ended before its first step:\n{out.read_text()[-3000:]}")
            time.sleep(2)
        result["first_step_s"] = round(time.monotonic() - t0, 1)
        start_mem, start_eps, start_steps = memory(proc.pid), episode_counts(work / "fileroot"), steps_done(out)
        print(f"soak: warm after {result['first_step_s']} s; soaking {args.minutes:g} min", file=sys.stderr)
        deadline, next_sample = time.monotonic() + args.minutes * 60, time.monotonic() + 60
        # the persistent processes' RSS each minute: warm-up growth levels off, a leak does not
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the run ended during the soak:\n{out.read_text()[-3000:]}")
            time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= next_sample:
                now = memory(proc.pid)
                samples.append(round(sum(r["rss_mib"] for k, r in now.items() if k != "desktops"), 1))
                next_sample += 60
        end_mem, end_eps, end_steps = memory(proc.pid), episode_counts(work / "fileroot"), steps_done(out)
        end_pids = tree(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(180)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    time.sleep(3)
    memory_rows = {}
    for name in sorted(set(start_mem) | set(end_mem)):
        a, b = start_mem.get(name, {}).get("rss_mib", 0.0), end_mem.get(name, {}).get("rss_mib", 0.0)
        memory_rows[name] = {"start_mib": a, "end_mib": b,
                             "growth_pct": round(100 * (b - a) / a, 1) if a else None,
                             "processes": [start_mem.get(name, {}).get("processes", 0),
                                           end_mem.get(name, {}).get("processes", 0)]}
    # Desktops come and go with the episodes in flight: their total follows how many are live, so the growth
    # that measures leaks is the persistent processes'; desktops are reported per live Xvfb instead.
    total_a = sum(r["start_mib"] for k, r in memory_rows.items() if k != "desktops")
    total_b = sum(r["end_mib"] for k, r in memory_rows.items() if k != "desktops")
    result.update({
        "memory": memory_rows,
        "rss_persistent_mib": [round(total_a, 1), round(total_b, 1)],
        "rss_persistent_per_minute_mib": samples,
        "rss_growth_pct": round(100 * (total_b - total_a) / total_a, 1) if total_a else None,
        # the same from the first minute's sample: processes that exist only around the first step (counted
        # in a role's "processes" at the start, gone at the end) cannot flatter it
        "rss_growth_pct_from_minute_1": round(100 * (samples[-1] / samples[0] - 1), 1) if len(samples) > 1 else None,
        "steps": end_steps - start_steps,
        "episodes_evaluated": end_eps["episodes_evaluated"] - start_eps["episodes_evaluated"],
        "episodes_lost": end_eps["episodes_lost"] - start_eps["episodes_lost"],
        "groups_rejected": end_eps["groups_rejected"] - start_eps["groups_rejected"],
        "leaked_desktops": len(pids("^Xvfb") - xvfb_before),
        "leaked_vllm": len(pids("areal_vllm_server") - vllm_before),
        "leaked_processes": len([p for p in end_pids if Path(f"/proc/{p}").exists()]),
        "exit_code": proc.returncode,
    })
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
