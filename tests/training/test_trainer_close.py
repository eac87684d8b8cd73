"""A failed run ends even when AReaL's close cannot (cua_rl/trainer/trainer.py ``Trainer.__exit__`` and ``run``).

A CI run met vLLM's multimodal cache desync: every request failed, the weight update's pause timed out after
600 s, and then AReaL's close asked the same hung engine to pause again and waited forever, with the launcher
waiting on it. Here the trainer's close never returns (as with that engine) and a non-daemon thread stands in
for AReaL's callback server, which would hold an orderly interpreter exit: the process must still end, soon,
with the failure's exit code and its cause on the console. Real AReaL trainer class; its close replaced."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, threading, time
from cua_rl.trainer import trainer as train

train.CLOSE_AFTER_FAILURE_S = 1
trainer = train.Trainer.__new__(train.Trainer)       # AReaL's trainer class, nothing started
trainer.close = (lambda: time.sleep(3600)) if sys.argv[1] == "hung" else (lambda: None)
if sys.argv[1] == "hung":
    threading.Thread(target=time.sleep, args=(3600,), name="callback-server").start()   # not a daemon

def failing():
    with trainer:
        if sys.argv[2] == "health":
            raise SystemExit(3)
        raise RuntimeError("Engine method 'update_weights' failed: read timed out")

train.run(failing)
"""


@pytest.mark.parametrize("close,failure,code", [("hung", "error", 1), ("hung", "health", 3), ("fine", "error", 1)])
def test_a_failed_run_ends_with_its_code_when_the_close_hangs(close, failure, code):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SCRIPT, close, failure], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    assert time.monotonic() - started < 60
    if failure == "error":
        assert "update_weights' failed" in out, out[-3000:]
    abandoned = "has not finished in 1 s" in out
    assert abandoned == (close == "hung"), out[-3000:]
