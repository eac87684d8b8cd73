"""AReaL's deployment rules (cua_rl/deploy.py) that a user's first GPU run or own settings meet: each test loads a
recipe through the launcher's own loader (``cua_rl.run.launch.load_config``) and asserts what it accepts or refuses.
No process is started and nothing is installed."""

from __future__ import annotations

import importlib.util

import pytest

from cua_rl.run.launch import RECIPES, ConfigError, load_config


@pytest.fixture(autouse=True)
def _fileroot(monkeypatch, tmp_path):
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))


def test_gpu_first_try_1_an_attention_whose_package_is_missing_is_refused_at_load():
    """The GPU recipes train with sdpa (nothing to install); flash_attention_2 where flash_attn is not importable
    (this machine, and every node set up from scripts/requirements-gpu.lock) is refused naming the package and
    sdpa, instead of transformers raising at model load minutes into the run."""
    assert importlib.util.find_spec("flash_attn") is None, "this test needs a host without flash-attn"
    for recipe in ("config.yaml", "config.1gpu.yaml"):
        assert load_config(str(RECIPES / recipe), []).actor.attn_impl == "sdpa", recipe
    with pytest.raises(ConfigError, match=r"actor.attn_impl 'flash_attention_2' needs the Python package "
                                          r"'flash_attn'.*actor.attn_impl=sdpa"):
        load_config(str(RECIPES / "config.yaml"), ["actor.attn_impl=flash_attention_2"])
    with pytest.raises(ConfigError, match=r"'kernels'"):
        load_config(str(RECIPES / "config.yaml"), ["actor.attn_impl=kernels-community/flash-attn"])
    assert load_config(str(RECIPES / "config.yaml"), ["actor.attn_impl=eager"]).actor.attn_impl == "eager"


@pytest.mark.parametrize("override", ["actor.reward_bias=-0.5", "actor.reward_scaling=10"])
def test_right_credit_2_a_reward_bias_or_scaling_is_refused_while_groups_are_normalised(override):
    """AReaL's example values (reward_bias -0.5, reward_scaling 10) applied to the workflow's group-normalised
    values made a success pull -247 and pushed every token down; refused at load, naming the setting. With the
    workflow's normalisation off, AReaL's own reward shaping is the user's to set."""
    name = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{name} must be .* while trajectory.normalise_in_group is on"):
        load_config(str(RECIPES / "config.yaml"), [override])
    load_config(str(RECIPES / "config.yaml"), [override, "trajectory.normalise_in_group=false"])


def test_gpu_first_try_3_model_base_url_is_refused_naming_what_replaced_it():
    """AReaL's cua_agent example's first command (``--model-base-url``) started a run where every group returned
    nothing and nothing stopped it; the launcher's load refuses it, names the flag, says that AReaL serves the
    policy through our endpoint and where the flag's meaning went (cua-eval --model-url)."""
    from cua_rl.run import cli

    request = cli.parse(["--gym", "http://127.0.0.1:5010", "--gym-id", "my_gym",
                         "--model-base-url", "http://127.0.0.1:8000/v1"], {}, [])
    with pytest.raises(ConfigError) as refused:
        load_config(str(RECIPES / "config.yaml"), request.overrides, request.flag_keys)
    message = str(refused.value)
    for part in ("policy endpoint", "AReaL", "trains nothing", "cua-eval --model-url", "set by --model-base-url"):
        assert part in message, (part, message)
