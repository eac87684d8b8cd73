"""The early trainer process (cua_rl/run/prewarm.py): the hand-over gives it its arguments and the late
environment only; an environment that differs in anything a module may read at import discards it (the
launcher then starts the trainer the ordinary way); without a hand-over it exits quietly. A stand-in child
runs the same ``read_hand_over`` as ``python -m cua_rl.train --from-launcher`` (which would import AReaL
first, 12 s); the launcher's real use is in every train.sh run of tests/e2e."""

import subprocess
import sys

from cua_rl.run.prewarm import Prewarmed

CHILD = ("import os; from cua_rl.run.prewarm import read_hand_over; args = read_hand_over(); "
         "print(args, os.environ.get('PROJECT_TOKEN'), os.environ.get('EARLY'), "
         "os.environ.get('VLLM_RPC_BASE_PATH', '-'))")


def _early(env: dict[str, str]) -> Prewarmed:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    return Prewarmed(proc, env)


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), "EARLY": "1", **extra}


def test_the_hand_over_carries_the_arguments_and_the_monitor_token():
    early = _early(_env())
    proc = early.hand_over(["--config", "x.yaml", "a=1"], _env(PROJECT_TOKEN="tok"))
    assert proc is not None
    assert proc.wait(60) == 0
    out = proc.stdout.read()
    assert out.decode().split() == ["['--config',", "'x.yaml',", "'a=1']", "tok", "1", "-"], out
    assert early.hand_over(["again"], _env()) is None      # one hand-over only


def test_the_runs_vllm_socket_folder_is_handed_over_not_a_difference():
    """The launcher makes a socket folder per run for vLLM (launch._vllm_socket_dir) after the early process
    started; vLLM reads it only when the trainer starts its servers. As a difference it discarded the early
    process of every CPU run ("environment differs: ['VLLM_RPC_BASE_PATH']", seen in the newcomer bench)."""
    early = _early(_env())
    proc = early.hand_over([], _env(VLLM_RPC_BASE_PATH="/tmp/run-sockets"))
    assert proc is not None and proc.wait(60) == 0
    assert proc.stdout.read().decode().split()[-1] == "/tmp/run-sockets"


def test_a_variable_read_at_import_that_changed_discards_the_early_process():
    for changed in (_env(TORCHDYNAMO_DISABLE="1"), {k: v for k, v in _env().items() if k != "EARLY"}):
        early = _early(_env())
        child = early.proc
        assert early.hand_over(["--config", "x.yaml"], changed) is None
        assert child.poll() is not None                    # ended, not left waiting


def test_variables_the_imports_set_themselves_are_not_a_difference():
    early = _early(_env())
    early.set_by_imports = frozenset({"SWANLAB_RUNTIME"})
    proc = early.hand_over([], _env(SWANLAB_RUNTIME="x"))
    assert proc is not None and proc.wait(60) == 0


def test_without_a_hand_over_it_exits_quietly():
    early = _early(_env())
    child = early.proc
    child.stdin.close()
    assert child.wait(60) == 0 and child.stdout.read() == b""
    early.discard()
