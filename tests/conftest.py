"""Suite-wide set-up shared by every test folder."""

import pytest

from cua_rl.asgi_thread import free_port
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
