"""A GPU node at first try (issue 82): what the launcher decides or refuses on a node with GPUs, shown here without
one. ``nvidia-smi`` is a script on the PATH that lists 1, 2, 4 or 8 GPUs as the real one does (``GPU i: ...``);
the placement is AReaL's own local scheduler run on the config the launcher chose, with no process started
(tests/run/test_gpu_placement.py's stand-ins).

Items: 2, the default recipe fitted to the GPUs present and a user's allocation too large for them refused;
4, the set-up plan on a GPU node (scripts/setup.sh's CUA_RL_SETUP_PLAN: which Debian packages, which lock, which
Python); 5, the vLLM server ``cua-eval`` starts for a checkpoint on a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cua_rl.run import cli, launch
from cua_rl.run.launch import RECIPES
from placement import areal_placement, creation_orders, shared_without_colocation

GYM = ["--gym", "http://127.0.0.1:5010", "--gym-id", "g"]


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """``fake_gpus(n)``: an ``nvidia-smi`` first on the PATH whose ``-L`` lists ``n`` GPUs, CUA_RL_DEVICE unset."""
    base_path = launch.os.environ["PATH"]

    def install(n: int) -> None:
        bin_dir = tmp_path / f"smi{n}"
        bin_dir.mkdir(exist_ok=True)
        script = bin_dir / "nvidia-smi"
        script.write_text('#!/bin/sh\n[ "$1" = -L ] || exit 1\n'
                          + "".join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-fake-{i})"\n' for i in range(n)))
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{base_path}")
        monkeypatch.delenv("CUA_RL_DEVICE", raising=False)
    return install


def _gpus_held(placed: dict) -> set[int]:
    return {g for workers in placed.values() for worker in workers for g in worker}


def test_gpu_first_try_2_the_default_recipe_uses_all_of_1_2_4_8_gpus(launcher, fake_gpus, tmp_path, no_processes):
    """On n GPUs (no allocation of the user's) the launcher's dry run says ``uses n of n``, and AReaL's scheduler,
    given the config the launcher chose, places the rollout, the actor and (KL penalty on) the reference on all
    n GPUs, in every order our Trainer and AReaL create the roles, no GPU shared without a colocation."""
    for n in (1, 2, 4, 8):
        fake_gpus(n)
        rc, report, _, out = launcher(GYM, device="auto")
        assert rc == 0, out.err
        assert report["gpus"].startswith(f"uses {n} of {n} ("), report["gpus"]
        request = cli.parse([*GYM, "actor.kl_ctl=0.05", "trajectory.group_weight=tokens"], {}, [])   # KL needs tokens
        path, why, config = launch.choose_config(request, True, n)
        assert "fitted" in why, why
        for i, order in enumerate(creation_orders(config)):
            placed = areal_placement(config, tmp_path / f"logs{n}-{i}", order)
            assert shared_without_colocation(config, placed) == [], (n, order, placed)
            assert _gpus_held(placed) == set(range(n)), (n, order, placed)
            assert placed["ref"] == placed["actor"], (n, placed)


def test_gpu_first_try_2_an_allocation_of_the_users_is_kept_and_refused_when_too_large(launcher, fake_gpus):
    """An allocation the user set (their config file, or an override of an allocation key) is not fitted: it is
    kept when the GPUs are there and refused at load, naming both numbers, when they are not."""
    fake_gpus(2)
    rc, _, _, out = launcher([*GYM, "--config", str(RECIPES / "config.yaml")], device="auto")
    assert rc == 2 and "needs 8 GPUs" in out.err and "this node has 2" in out.err, out.err
    rc, _, _, out = launcher([*GYM, "rollout.backend=vllm:d2p1t1", "actor.backend=fsdp:d2"], device="auto")
    assert rc == 2 and "needs 4 GPUs" in out.err and "this node has 2" in out.err, out.err
    fake_gpus(8)
    rc, report, overrides, out = launcher([*GYM, "rollout.backend=vllm:d2p1t1", "actor.backend=fsdp:d2"],
                                          device="auto")
    assert rc == 0 and report["gpus"].startswith("uses 4 of 8 (the allocation as written"), (report, out.err)
    assert not any(o.startswith("cluster.n_gpus_per_node") for o in overrides), overrides


def test_gpu_first_try_2_print_config_prints_the_resolved_config_as_yaml(launcher, fake_gpus, capsys):
    """``--print-config`` prints the config the run would use (fitted to the GPUs present) as YAML on stdout."""
    import yaml

    fake_gpus(4)
    assert launch.main(["--print-config", *GYM]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["cluster"]["n_gpus_per_node"] == 4
    assert printed["rollout"]["backend"] == "vllm:d2p1t1" and printed["actor"]["backend"] == "fsdp:d2"
    assert printed["gym_base_url"] == "http://127.0.0.1:5010"


def test_gpu_first_try_5_cua_eval_on_a_gpu_starts_areal_vllm_server_on_the_gpu(tmp_path, monkeypatch):
    """``cua-eval`` with the GPU recipe (what it picks where a GPU is listed) and no ``--model-url`` starts AReaL's
    vLLM server for the checkpoint with the recipe's ``vllm`` section on the GPU: no CPU backend, no CPU worker
    extension, no CPU environment; with the CPU recipe it is still the CPU server. The command is built as
    ``VLLMServer`` builds it; nothing starts."""
    from cua_rl.evaluate import eval_vllm_config
    from cua_rl.local_model.vllm_server import CPU_ENV, CPU_WORKER_EXTENSION, server_command

    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    checkpoint = str(tmp_path / "step-7")
    config = launch.load_config(str(RECIPES / "config.yaml"), ["gym_base_url=http://127.0.0.1:5010", "gym_id=g"])
    cfg = eval_vllm_config(config, checkpoint)
    assert cfg is not None, "cua-eval on a GPU recipe would start no server (it needed --model-url)"
    cmd, env = server_command(cfg, "127.0.0.1", 8123, on_cpu=cfg is None)
    text = " ".join(cmd)
    assert "areal.engine.vllm_ext.areal_vllm_server" in text, text
    assert f"--model {checkpoint}" in text and "--port 8123" in text, text
    assert f"--gpu-memory-utilization {config.vllm.gpu_memory_utilization}" in text, text
    assert f"--max-model-len {config.vllm.max_model_len}" in text, text
    assert "--logprobs-mode processed_logprobs" in text, text   # the run's sampling logprobs
    assert "--distributed-executor-backend uni" not in text and CPU_WORKER_EXTENSION not in text, text
    assert all(env.get(k) == launch.os.environ.get(k) for k in CPU_ENV), "vLLM's CPU environment on a GPU"
    cpu = launch.load_config(str(RECIPES / "config.cpu.yaml"), ["gym_base_url=http://127.0.0.1:5010", "gym_id=g"])
    assert eval_vllm_config(cpu, checkpoint) is None   # the CPU recipe: VLLMServer's CPU server, as before


ROOT = Path(__file__).resolve().parents[2]


def _setup_plan(tmp_path, gpus: int, python: str = "3.11 x86_64", **env) -> tuple[int, str]:
    """``scripts/setup.sh`` in its plan mode (CUA_RL_SETUP_PLAN=1) on a node whose ``nvidia-smi -L`` lists ``gpus``
    GPUs and whose ``python3`` says ``python`` (version and machine): (exit code, stdout + stderr). ``sudo`` and
    ``apt-get`` on its PATH refuse, and CUA_RL_HOME is in ``tmp_path``, so nothing is installed whatever it does."""
    import os
    import subprocess

    bin_dir = tmp_path / f"bin{gpus}"
    bin_dir.mkdir(exist_ok=True)
    fakes = {"sudo": "echo refused in a test >&2; exit 1", "apt-get": "echo refused in a test >&2; exit 1",
             "python3": f'echo "{python}"',
             # a pause between lines, as a real nvidia-smi may take: set-up must read its whole answer (under
             # pipefail, `nvidia-smi -L | grep -q` failed when grep left before the next line: a GPU node read as a
             # CPU one, twice in full CI runs; with the pause, every time on the old script)
             "nvidia-smi": "sleep 0.2\n".join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-fake-{i})"\n'
                                              for i in range(gpus))}
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    if not gpus:
        (bin_dir / "nvidia-smi").unlink()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CUA_RL_")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=60,
                          env={**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CUA_RL_SETUP_PLAN": "1",
                               "CUA_RL_HOME": str(tmp_path / "home"), "CUA_RL_PYTHON": str(bin_dir / "python3"),
                               **env})
    return proc.returncode, proc.stdout + proc.stderr


def test_gpu_first_try_4_setup_on_a_gpu_node_installs_no_desktop_package_and_checks_python(tmp_path):
    """On a node with GPUs, set-up plans the GPU lock and no Debian package (the launcher's preflight installs an
    embedded gym's when a run turns out embedded; CUA_RL_APT=embedded asks for them all); a Python other than the
    lock's 3.11 on x86_64 is refused, saying what to do; without a GPU the embedded stack's packages stay the
    default."""
    every = [line.split()[0] for line in (ROOT / "scripts" / "apt-packages.txt").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    rc, out = _setup_plan(tmp_path, gpus=2)
    assert rc == 0, out
    assert "device: gpu" in out and "lock: scripts/requirements-gpu.lock" in out, out
    assert "debian packages (CUA_RL_APT=none): 0 asked for" in out, out
    assert "debian packages to install: 0" in out, out
    rc, out = _setup_plan(tmp_path, gpus=2, CUA_RL_APT="embedded")
    assert rc == 0 and f"debian packages (CUA_RL_APT=embedded): {len(every)} asked for: {' '.join(every)}" in out, out
    rc, out = _setup_plan(tmp_path, gpus=0)
    assert rc == 0 and "device: cpu" in out and f"(CUA_RL_APT=embedded): {len(every)} asked for" in out, out
    rc, out = _setup_plan(tmp_path, gpus=8, python="3.10 x86_64")
    assert rc == 2 and "is Python 3.10" in out and "made for Python 3.11" in out and "CUA_RL_PYTHON" in out, out
    rc, out = _setup_plan(tmp_path, gpus=8, python="3.11 aarch64")
    assert rc == 2 and "runs on aarch64" in out and "x86_64 only" in out, out
    assert not (tmp_path / "home").exists(), "the plan made the set-up's home"
