"""Does a run stop itself on garbage, and only on garbage? Provoked cases and a healthy run, on the CPU stack.

Each case is ``train.sh`` as a user runs it (real desktops, agent service, vLLM, AReaL's trainer), with one
thing broken; the run's health checks (cua_rl/trainer/health.py, docs/health.md) must stop it within two
steps, exit code 3, naming the invariant; the healthy run must finish with no stop:

- ``healthy``: the default CPU recipe (config.learn.yaml, its warm start), ``--steps`` steps;
- ``policy_unreached``: the agent is given a policy URL that does not reach the endpoint
  (``policy.advertised_host`` on an address nobody listens on; tests/e2e/test_health_stop.py is this case in CI);
- ``gym_down``: the gym as its own process (``--gym``), killed after the first step and not restarted;
- ``stale_weights``: vLLM acknowledges every weight update and keeps its first weights (a test double of the
  worker extension, tests/doubles/stale_vllm.py): ``weights_unchanged`` must stop the run after the first
  update with a learning rate above 0 (step 2 here: step 1's is 0, warm-up);
- ``model_hung``: after the first step the vLLM engine process is stopped (SIGSTOP; its front end still answers
  ``/health``), as vLLM's multimodal cache desync once hung it in CI: nothing fails and nothing ends, and
  ``idle_seconds`` (set to 40 s here) must stop the run.

Turns recorded on vLLM without the prompt proof (``unproved_vllm_turns``) need a vLLM on which the proof
cannot be installed (``policy.require_prompt_proof=false`` alone changes nothing while it can be): that case
is tests/workflow/test_workflow_episode.py's, on the real stack with the proof's installation refused.

Prints JSON: per case the exit code, the first step a check stopped at, the console's ``[cua-rl] health``
lines, the summary's cause and the wall time.

Usage: python bench/health_bench.py [--cases healthy,policy_unreached,gym_down,stale_weights,model_hung] [--steps 3]
       [--out F]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cua_rl.http.serve import free_port  # noqa: E402
from tests.hosts import Service  # noqa: E402  (one of our servers as its own process)

TRAIN = ["bash", str(ROOT / "examples/cua_agent/train.sh")]
NO_WARM_START = ["sft.warm_start=false"]   # the policy section is part of the warm start's key
STALE_WEIGHTS = ["vllm.worker_extension_cls=tests.doubles.stale_vllm.IgnoresWeightUpdates"]
SMALL = ["train_dataset.batch_size=1", "gconfig.n_samples=2", "health.stall_seconds=20"]


def _result(name: str, rc: int, out: str, seconds: float) -> dict:
    stop = re.search(r"HEALTH STOP after step (\d+)", out)
    cause = re.search(r"^\[cua-rl\] cause: +(.*)$", out, re.M)
    return {"case": name, "exit_code": rc, "stopped_after_step": int(stop.group(1)) if stop else None,
            "health_lines": re.findall(r"^\[cua-rl\] health step .*$", out, re.M),
            "cause": cause.group(1) if cause else None,
            "steps_done": max((int(n) for n in re.findall(r"\[cua-rl\] step (\d+)/", out)), default=0),
            "seconds": round(seconds, 1)}


def _train(name: str, args: list[str], work: Path, env: dict) -> dict:
    started = time.monotonic()
    proc = subprocess.run([*TRAIN, f"trial_name={name}", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    (work / f"{name}.log").write_text(out)
    return _result(name, proc.returncode, out, time.monotonic() - started)


def _gym_down(work: Path, env: dict, steps: int) -> dict:
    gym = Service(["cua_rl.local_gym", "serve", "--gym-id", "desktop", "--pool-size", "2"], free_port(), work, "gym")
    agent = Service(["cua_rl.local_agent", "serve"], free_port(), work, "agent")
    log = work / "gym_down.log"
    started = time.monotonic()
    gym.start()
    agent.start()
    trainer = subprocess.Popen([*TRAIN, "--gym", gym.url, "--gym-id", "desktop", "--gbox-mini-url", agent.url,
                                "trial_name=gym_down", f"total_train_steps={steps + 6}", "max_task_time_seconds=20",
                                *SMALL], cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        while trainer.poll() is None and not re.search(r"\[cua-rl\] step 1/", log.read_text(errors="replace")):
            time.sleep(0.5)
        gym.kill()   # and not restarted
        rc = trainer.wait(900)
    finally:
        if trainer.poll() is None:
            trainer.kill()
        agent.stop()
        gym.stop()
    return _result("gym_down", rc, log.read_text(errors="replace"), time.monotonic() - started)


def _descendants(pid: int) -> list[int]:
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                text=True).stdout.split()]
    return children + [d for c in children for d in _descendants(c)]


def _model_hung(work: Path, env: dict) -> dict:
    log = work / "model_hung.log"
    started = time.monotonic()
    servers_before = set(_pgrep("areal_vllm_server"))
    trainer = subprocess.Popen([*TRAIN, "trial_name=model_hung", "total_train_steps=6", *SMALL,
                                "+health.thresholds.idle_seconds=40"], cwd=ROOT, env=env, stdout=open(log, "w"),
                               stderr=subprocess.STDOUT)
    frozen: list[int] = []
    try:
        while trainer.poll() is None and not re.search(r"\[cua-rl\] step 1/", log.read_text(errors="replace")):
            time.sleep(0.5)
        for server in set(_pgrep("areal_vllm_server")) - servers_before:
            frozen += _descendants(server)   # the engine core (and its workers); the front end keeps answering
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        print(f"[health-bench] model_hung: stopped vLLM's engine processes {frozen}", file=sys.stderr, flush=True)
        rc = trainer.wait(900)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if trainer.poll() is None:
            trainer.kill()
    result = _result("model_hung", rc, log.read_text(errors="replace"), time.monotonic() - started)
    result["engine_processes_stopped"] = len(frozen)
    return result


def _pgrep(pattern: str) -> list[int]:
    return [int(p) for p in subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="healthy,policy_unreached,gym_down,stale_weights,model_hung")
    parser.add_argument("--steps", type=int, default=3, help="steps of the healthy run")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="health-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUA_RL_FILEROOT": str(work / "fileroot"), "CUA_RL_DEVICE": "cpu"}
    env.pop("GYM_BASE_URL", None)
    runs = {
        "healthy": lambda: _train("healthy", [f"total_train_steps={args.steps}"], work, env),
        "policy_unreached": lambda: _train("policy_unreached", ["total_train_steps=6", *NO_WARM_START, *SMALL,
                                                                "policy.advertised_host=127.0.0.2"], work, env),
        "gym_down": lambda: _gym_down(work, env, args.steps),
        "stale_weights": lambda: _train("stale_weights", ["total_train_steps=8", *STALE_WEIGHTS], work, env),
        "model_hung": lambda: _model_hung(work, env),
    }
    results = []
    for name in args.cases.split(","):
        print(f"[health-bench] {name} ...", file=sys.stderr, flush=True)
        results.append(runs[name]())
        print(f"[health-bench] {json.dumps(results[-1])}", file=sys.stderr, flush=True)
    text = json.dumps({"workdir": str(work), "cases": results}, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return results


if __name__ == "__main__":
    main()
