"""A failed run ends even when AReaL's close cannot (cua_rl/trainer/trainer.py ``Trainer.__exit__`` and ``run``).

A CI run met vLLM's multimodal cache desync: every request failed, the weight update's pause timed out after
600 s, and then AReaL's close asked the same hung engine to pause again and waited forever, with the launcher
waiting on it. Here the trainer's close never returns (as with that engine) and a non-daemon thread stands in
for AReaL's callback server, which would hold an orderly interpreter exit: the process must still end, soon,
with the failure's exit code and its cause on the console. Real AReaL trainer class; its close replaced."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# One process imports the trainer (AReaL, torch: 20-50 s on 2 cores), then each case runs in a child forked from it,
# as its own `python -c` did before: the child's output to a file of its own, its exit as the interpreter's (an
# uncaught exception, SystemExit's code, the non-daemon thread joined at an orderly exit, or run's os._exit).
SCRIPT = """
import json, os, sys, threading, time
from cua_rl.trainer import trainer as train

train.CLOSE_AFTER_FAILURE_S = 1

def case(close, failure):
    trainer = train.Trainer.__new__(train.Trainer)       # AReaL's trainer class, nothing started
    trainer.close = (lambda: time.sleep(3600)) if close == "hung" else (lambda: None)
    if close == "hung":
        threading.Thread(target=time.sleep, args=(3600,), name="callback-server").start()   # not a daemon

    def failing():
        with trainer:
            if failure == "health":
                raise SystemExit(3)
            raise RuntimeError("Engine method 'update_weights' failed: read timed out")

    train.run(failing)

results = {}
for spec in sys.argv[2:]:
    close, failure = spec.split("-")
    out = os.path.join(sys.argv[1], spec + ".out")
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1), os.dup2(fd, 2)
        case(close, failure)      # what it raises ends this child as an uncaught exception ends `python -c`
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    results[spec] = {"code": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - started,
                     "out": open(out).read()}
print(json.dumps(results))
"""
CASES = [("hung", "error", 1), ("hung", "health", 3), ("fine", "error", 1)]


@pytest.fixture(scope="module")
def ended(tmp_path_factory):
    """Each case's exit code, seconds from its fork to its end, and output."""
    folder = tmp_path_factory.mktemp("close")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), *(f"{c}-{f}" for c, f, _ in CASES)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("close,failure,code", CASES)
def test_a_failed_run_ends_with_its_code_when_the_close_hangs(ended, close, failure, code):
    result = ended[f"{close}-{failure}"]
    out = result["out"]
    assert result["code"] == code, out[-3000:]
    assert result["seconds"] < 60
    if failure == "error":
        assert "update_weights' failed" in out, out[-3000:]
    abandoned = "has not finished in 1 s" in out
    assert abandoned == (close == "hung"), out[-3000:]
