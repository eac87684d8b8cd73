"""A newcomer's first run, timed: the README's two commands from a fresh clone; prints JSON.

    python bench/newcomer_bench.py [--out docs/bench/newcomer_bench.json] [--console docs/bench/newcomer_console.txt]

Clones this repository's HEAD into a new folder and runs there, one after the other, exactly what the README's
quick start says: ``bash scripts/setup.sh`` then ``./examples/cua_agent/train.sh``, with a fresh ``CUA_RL_HOME``:
no tiny model, no kept warm start, no kept held-out score. The Python environment is, with ``--env existing``
(the default), this machine's, linked into the fresh home (what a second clone meets: set-up only links the clone);
with ``--env fresh``, built by set-up from the package cache (a hard-linked copy of this machine's, ``--uv-cache``,
so downloads are not what is measured). The Debian packages are this machine's.

From the console (stdout and stderr together, each line stamped when it arrived):
  - ``setup_s``, ``run_s``, ``total_s``: each command's wall time and both together;
  - ``warm_start_s``: from the run's start to the trainer's start (the tiny model, the warm start: built, or the
    pinned one copied); ``steps_s``: from the trainer's start to the last step's line; ``verdict_s``: from the
    verdict's first line to its result;
  - ``console_lines`` (set-up's and the run's), the verdict and the proof lines (prompt ids verified, episodes);
  - ``cpu``: the processor, its cores, and how busy all of them were over each phase (/proc/stat: the machine
    should be otherwise idle) with the CPU seconds of the commands' process trees (RUSAGE_CHILDREN).
The bar (issue 86): ``total_s`` at most 720 on 2 cores, ``console_lines`` at most 60, the verdict given.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Console markers of the phases (the launcher's own lines: cua_rl/run/launch.py, cua_rl/run/summary.py)
TRAINER_START = re.compile(r"starting the trainer")
LAST_STEP = re.compile(r"\[cua-rl\] step (\d+)/\1:")
VERDICT_START = re.compile(r"\[cua-rl\] verdict: +judging")
VERDICT_RESULT = re.compile(r"\[cua-rl\] verdict: +(LEARNED|NOT LEARNED|[A-Z][A-Z ]+):")
PROOF = re.compile(r"\[cua-rl\] (policy endpoint|episodes): ")
MAX_TOTAL_S, MAX_LINES = 720, 60


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]   # idle + iowait
    return sum(fields) - idle, sum(fields)


def _run(cmd: list[str], cwd: Path, env: dict, lines: list[dict], label: str, limit_s: float) -> dict:
    """Run ``cmd``, echoing and stamping every console line into ``lines``; its wall time, CPU and exit code."""
    before_cpu, before_j = resource.getrusage(resource.RUSAGE_CHILDREN), _jiffies()
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        for line in proc.stdout:
            lines.append({"t": round(time.monotonic() - T0, 2), "cmd": label, "line": line.rstrip("\n")})
            print(line, end="", flush=True)
            if time.monotonic() - started > limit_s:
                raise TimeoutError(f"{label} ran past {limit_s:.0f} s")
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=60)
    after_cpu, after_j = resource.getrusage(resource.RUSAGE_CHILDREN), _jiffies()
    busy, total = after_j[0] - before_j[0], after_j[1] - before_j[1]
    return {"rc": rc, "wall_s": round(time.monotonic() - started, 1),
            "cpu_s": round(after_cpu.ru_utime + after_cpu.ru_stime - before_cpu.ru_utime - before_cpu.ru_stime, 1),
            "busy_fraction": round(busy / total, 3) if total else None}


def _first(lines: list[dict], pattern: re.Pattern, cmd: str = "run") -> float | None:
    return next((x["t"] for x in lines if x["cmd"] == cmd and pattern.search(x["line"])), None)


def _span(a: float | None, b: float | None) -> float | None:
    return round(b - a, 1) if a is not None and b is not None else None


def phases(lines: list[dict], run_started: float, run_ended: float) -> dict:
    """The run's phases from its console markers (None where a marker is missing)."""
    trainer, last = _first(lines, TRAINER_START), None
    for x in lines:
        if x["cmd"] == "run" and LAST_STEP.search(x["line"]):
            last = x["t"]
    verdict_start, verdict_end = _first(lines, VERDICT_START), _first(lines, VERDICT_RESULT)
    return {"warm_start_s": _span(run_started, trainer), "steps_s": _span(trainer, last),
            "verdict_s": _span(verdict_start, verdict_end), "after_verdict_s": _span(verdict_end, run_ended)}


def main(argv: list[str] | None = None) -> int:
    global T0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="", help="where the clone and the fresh home go (default: a new temp dir)")
    p.add_argument("--uv-cache", default=os.path.expanduser("~/.cache/cua-rl/uv-cache"),
                   help="the package cache hard-linked into the fresh home ('' : none, set-up downloads)")
    p.add_argument("--env", choices=("existing", "fresh"), default="existing",
                   help="this machine's Python environment linked into the fresh home, or a fresh one built")
    p.add_argument("--limit-s", type=float, default=2400, help="stop a command that runs longer than this")
    p.add_argument("--out", default="", help="also write the JSON here")
    p.add_argument("--console", default="", help="write the console (both commands) here")
    args = p.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="newcomer-"))
    clone, home = work / "clone", work / "home"
    shutil.rmtree(clone, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    T0 = time.monotonic()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    clone_s = round(time.monotonic() - T0, 1)
    machine_home = Path(args.uv_cache).parent
    if args.env == "existing":   # the environment, its tools and package cache: this machine's, linked
        venv = (machine_home / "current").resolve()
        for name in (venv.name, "tools", "uv-cache"):
            (home / name).symlink_to(machine_home / name)
    elif args.uv_cache and Path(args.uv_cache).is_dir():
        subprocess.run(["cp", "-al", args.uv_cache, str(home / "uv-cache")], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUA_RL_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(CUA_RL_HOME=str(home), PATH=":".join(d for d in env.get("PATH", "").split(":")
                                                      if "cua-rl" not in d and ".venv" not in d))
    lines: list[dict] = []
    setup = _run(["bash", "scripts/setup.sh"], clone, env, lines, "setup", args.limit_s)
    run_started = time.monotonic() - T0
    run = _run(["./examples/cua_agent/train.sh"], clone, env, lines, "run", args.limit_s) if setup["rc"] == 0 \
        else {"rc": None, "wall_s": 0}
    run_ended = time.monotonic() - T0
    verdict = next((x["line"] for x in lines if VERDICT_RESULT.search(x["line"])), None)
    console_lines = len(lines)
    record = {"newcomer_bench": {
        "commit": commit, "machine": {"cpu": _cpu_model(), "cores": os.cpu_count()},
        "total_s": round(setup["wall_s"] + run["wall_s"], 1), "clone_s": clone_s,
        "setup_s": setup["wall_s"], "run_s": run["wall_s"], **phases(lines, run_started, run_ended),
        "console_lines": console_lines,
        "setup_lines": sum(x["cmd"] == "setup" for x in lines), "run_lines": sum(x["cmd"] == "run" for x in lines),
        "cpu": {"model": _cpu_model(), "cores": os.cpu_count(), "setup": setup, "run": run},
        "verdict": verdict, "proof": [x["line"] for x in lines if PROOF.search(x["line"])],
        "env": args.env, "home": ("fresh CUA_RL_HOME with this machine's Python environment linked" if
                                  args.env == "existing" else "fresh CUA_RL_HOME and environment; the package cache "
                                  "a hard-linked copy of this machine's" if args.uv_cache else
                                  "fresh CUA_RL_HOME and environment, empty package cache"),
        "bar": {"total_s_max": MAX_TOTAL_S, "console_lines_max": MAX_LINES}}}
    bench = record["newcomer_bench"]
    bench["met"] = bool(setup["rc"] == 0 and run["rc"] == 0 and verdict and bench["total_s"] <= MAX_TOTAL_S
                        and console_lines <= MAX_LINES)
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.console:
        Path(args.console).write_text("".join(x["line"] + "\n" for x in lines))
    if not args.workdir:   # the clone and the fresh home (the run's logs stay under its fileroot)
        shutil.rmtree(work, ignore_errors=True)
    return 0 if setup["rc"] == 0 and run["rc"] == 0 else 1


T0 = 0.0

if __name__ == "__main__":
    sys.exit(main())
