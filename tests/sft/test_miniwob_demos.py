"""The MiniWoB++ warm start's demonstrator and chance baseline on real pages (Chromium on Xvfb, one MiniWoB++ gym):

1. a DOM solver's demonstration is the agent's own turns (system prompt with the tool schema, the instance's
   utterance as the task, the click as a qwen3-vl tool call, then terminate), scored 1.0 by the page, and it turns
   into RL-identical rows with the loss on the replies only;
2. a task without a solver is refused before anything plays;
3. the chance baseline's random-target policy finds the one valid target of click-test and wins with it, and
   finds click-test-2's two buttons.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
from pathlib import Path

import pytest

from cua_rl.local_gym import start_gym_server
from cua_rl.sft import demo_rows, qwen3_vl_reply
from cua_rl.sft.miniwob_demos import record_miniwob_demos

pytestmark = [pytest.mark.desktop, pytest.mark.skipif(shutil.which("chromium") is None,
                                                      reason="chromium missing; run scripts/setup.sh")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gym():
    with start_gym_server(port=0, gym_id="miniwob", pool_size=1, max_executions=2) as server:
        yield server


def test_a_dom_demonstration_is_the_agents_turns_and_becomes_rows(gym, processor):
    from cua_rl.policy import EndpointSettings

    [demo] = asyncio.run(record_miniwob_demos(gym, ["click-test-2"], [0], history_images=3))
    assert demo.reward == 1.0 and demo.task_id == "click-test-2" and demo.instruction.startswith("Click button")
    click, end = demo.turns
    assert click.messages[0]["role"] == "system" and "computer_use" in click.messages[0]["content"]
    assert click.messages[1]["content"][0]["text"] == f"Task: {demo.instruction}"
    assert '"left_click"' in click.reply and end.reply == qwen3_vl_reply(None)
    assert end.messages[2]["content"] == click.reply   # the history replays the click's reply
    rows = demo_rows(processor, processor.tokenizer, EndpointSettings(max_screenshots_in_history=2,
                                                                      max_pixels=200704), demo)
    assert len(rows) == 2 and all(float(r["rewards"]) == 1.0 for r in rows)
    for row in rows:   # the loss is on the reply (and its end-of-turn token) only
        assert 0 < int(row["loss_mask"].sum()) < row["input_ids"].shape[-1]


def test_a_task_without_a_solver_is_refused_before_anything_plays(gym):
    with pytest.raises(ValueError, match="no DOM solver for MiniWoB\\+\\+ task\\(s\\) \\['use-colorwheel'\\]"):
        asyncio.run(record_miniwob_demos(gym, ["click-test", "use-colorwheel"], [0]))
    assert gym.manager.executions == {}


def test_the_random_target_policy_finds_the_pages_valid_targets(gym):
    from cua_rl.genv import GenvClient
    from cua_rl.local_gym.curriculum import heldout_seeds

    spec = importlib.util.spec_from_file_location("miniwob_chance", ROOT / "bench" / "miniwob_chance.py")
    chance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chance)

    async def play():
        async with GenvClient(gym.url, gym.gym_id) as client:
            seed = heldout_seeds(1)[0]
            return (await chance.play_one(client, gym, "click-test", seed, "target"),
                    await chance.play_one(client, gym, "click-test-2", seed, "target"))
    (won, one), (_, two) = asyncio.run(play())
    assert (won, one, two) == (True, 1, 2)


def _config(tmp_path: Path, *overrides: str):
    from areal.api.cli_args import load_expr_config

    from cua_rl.config import CUAConfig

    cfg, _ = load_expr_config(["--config", str(ROOT / "examples" / "cua_agent" / "config.cpu.yaml"),
                               f"cluster.fileroot={tmp_path}", "gym_id=miniwob", *overrides], CUAConfig)
    return cfg


def test_python_m_cua_rl_sft_builds_miniwob_demonstrations_from_config(tmp_path, monkeypatch):
    """``gym_id=miniwob`` with ``sft.tasks`` naming MiniWoB++ pages: the SFT build's demonstrations are the DOM
    solvers' on training seeds (the SFT training itself is tests/sft/test_sft.py's); what cannot work is refused,
    and the warm start's key tells a MiniWoB++ build from a curriculum one of the same settings."""
    from cua_rl.sft import warm_start
    from cua_rl.sft.__main__ import _miniwob_demos

    config = _config(tmp_path, "sft.tasks=[focus-text]", "sft.demos_per_task=1", "sft.demo_error_rate=0.0")
    [demo] = _miniwob_demos(config)
    assert (demo.task_id, demo.seed, demo.reward, len(demo.turns)) == ("focus-text", 0, 1.0, 2)
    for bad, why in ((["sft.tasks=[no-such-page]"], "does not serve: \\['no-such-page'\\]"),
                     (["sft.demo_error_rate=0.2"], "demo_error_rate"),
                     (["gym_base_url=http://127.0.0.1:9"], "in-process")):
        with pytest.raises(SystemExit, match=why):
            _miniwob_demos(_config(tmp_path, "sft.demo_error_rate=0.0", *bad))
    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    same = ["sft.tasks=[050]", f"actor.path={tmp_path / 'model'}"]
    (tmp_path / "model").mkdir()
    assert warm_start.warm_start_key(_config(tmp_path, *same)) != warm_start.warm_start_key(
        _config(tmp_path, *same, "gym_id=desktop"))
