"""A Ctrl-C reaches the launcher whichever of its threads the kernel hands it to
(cua_rl/run/launch.py ``wait_interruptibly``, which the learning bench's stage wait uses too).

Python runs signal handlers in the main thread only; the kernel delivers a signal sent to a process to any of its
threads that does not block it (the embedded gym's, the agent service's, the console's reader). A main thread
blocked in ``waitpid`` then sleeps on until its child ends by itself: a CI run (session 34) trained on for two
minutes after its Ctrl-C and was killed. Reproduced deterministically here: on Linux, ``kill`` with the id of a
thread that is not the main one makes that thread the signal's target. The launcher's trainer wait is given a
stand-in trainer that sleeps for two minutes; the signal goes to the console reader's thread.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hosts import stop

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = """
import os
import sys
from pathlib import Path
from cua_rl.run.launch import _run_trainer
up = sys.argv[1] + ".up"
trainer = [sys.executable, "-c", f"import pathlib, time; pathlib.Path({up!r}).touch(); time.sleep(120)"]
rc, by = _run_trainer(trainer, dict(os.environ), Path(sys.argv[1]))
print(f"launcher: exit code {rc}, stopped by {by}", flush=True)
"""


def _other_threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]


def _handles_sigterm(pid: int) -> bool:
    """The launcher's handlers are in place (it installs SIGINT's and then SIGTERM's once its trainer started)."""
    caught = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_handed_to_another_thread_stops_the_trainer_at_once(tmp_path, sig):
    log = tmp_path / "train.log"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(log)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (Path(f"{log}.up").is_file() and _other_threads(launcher.pid) and _handles_sigterm(launcher.pid)):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stdout.read()
            time.sleep(0.1)
        os.kill(_other_threads(launcher.pid)[0], sig)   # a thread id: the kernel picks that thread to take the signal
        try:
            out, _ = launcher.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher did not stop within 30 s of {sig.name} (its trainer sleeps 120 s)")
    finally:
        stop(launcher, signal.SIGKILL)
    assert f"launcher: exit code {128 + sig}, stopped by {int(sig)}" in out, out
