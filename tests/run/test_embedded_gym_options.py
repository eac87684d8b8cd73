"""The embedded stack's browser options reach the gym that launch.py starts: by default (config.yaml's
``embedded.reuse_browsers`` and ``embedded.restart_in_page`` null = the gym's defaults) a training run's MiniWoB++
gym serves the second episode in the first one's browser, restarted in its page; ``embedded.reuse_browsers=0``
(a Hydra override of a training run) gives every episode a new browser (tests/local_gym/test_miniwob.py shows what
reuse and the in-page restart leave of an episode: nothing)."""
from __future__ import annotations

import contextlib

import pytest
from areal.api.cli_args import load_expr_config

from cli_cases import EXAMPLE
from cua_rl.config import CUAConfig
from cua_rl.genv import GenvClient
from cua_rl.run import launch


@pytest.mark.parametrize("overrides, reused", [([], True), (["embedded.reuse_browsers=0"], False)],
                         ids=["default", "new_browser_per_episode"])
async def test_the_embedded_gym_reuses_browsers_unless_the_config_says_not_to(tmp_path, overrides, reused):
    config, _ = load_expr_config(
        ["--config", str(EXAMPLE / "config.yaml"), f"cluster.fileroot={tmp_path}", "gym_id=miniwob",
         "embedded.num_desktops=1", *overrides], CUAConfig)
    with contextlib.ExitStack() as stack:
        env: dict[str, str] = {}
        overrides = dict(o.split("=", 1) for o in launch._start_embedded(config, stack, env))
        async with GenvClient(overrides["gym_base_url"], overrides["gym_id"], token=env["CUA_GYM_TOKEN"]) as client:
            async with client.execution("click-test", {"seed": 1}) as ex:
                assert ex.raw["reused"] is False
                first = ex.raw["device"]["display"]
            async with client.execution("click-test", {"seed": 2}) as ex:
                assert ex.raw["reused"] is reused and (ex.raw["device"]["display"] == first) is reused
