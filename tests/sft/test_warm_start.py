"""The kept SFT warm start (cua_rl/sft/warm_start.py): its key follows what the checkpoint depends on and
nothing else, and only a complete build is ever reused. The build itself is the ``python -m cua_rl.sft``
command tests/sft/test_sft.py runs; the learning gate (tests/e2e/test_learning_gate.py) trains from it."""

import json
from pathlib import Path

import pytest
from areal.api.cli_args import load_expr_config

from cua_rl.config import CUAConfig
from cua_rl.local_model import tiny
from cua_rl.sft import warm_start

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cua_agent"
REAL_PINS = warm_start.PINS


def _config(tmp_path: Path, *overrides: str) -> CUAConfig:
    cfg, _ = load_expr_config(["--config", str(EXAMPLE / "config.cpu.yaml"), f"cluster.fileroot={tmp_path}",
                               *overrides], CUAConfig)
    return cfg


def test_the_key_follows_the_demonstrations_the_prompt_and_the_base_model_only(tmp_path, monkeypatch):
    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    base = warm_start.warm_start_key(_config(tmp_path / "a"))
    # where it is written, whether it is used, and the RL settings do not change what is built
    assert warm_start.warm_start_key(_config(tmp_path / "b", "sft.output_dir=/elsewhere", "sft.warm_start=false",
                                             "actor.optimizer.lr=0.5", "gconfig.n_samples=8")) == base
    # the demonstrations, the prompt and the base model do
    for override in ("sft.demo_error_rate=0.1", "sft.steps=7", "policy.max_pixels=100352",
                     "gbox_mini_agent_agent=mai-ui", f"actor.path={tmp_path / 'other-model'}"):
        assert warm_start.warm_start_key(_config(tmp_path / "c", override)) != base, override


def test_the_key_follows_the_demonstrated_tasks_files_and_no_other_task(tmp_path, monkeypatch):
    """A warm start depends on the task files of the tasks it demonstrates (sft.tasks), not on every task of
    the gym: an edit to task 010 rebuilt every warm start once per machine (16 minutes of a CI run)."""
    import shutil

    from cua_rl.local_gym import tasks as gym_tasks

    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    copy = tmp_path / "tasks"
    shutil.copytree(gym_tasks.TASKS_DIR, copy)
    monkeypatch.setattr(gym_tasks, "TASKS_DIR", copy)
    config = _config(tmp_path / "a", "sft.tasks=[054]")
    base = warm_start.warm_start_key(config)
    other = copy / "010-editor-new-document.yaml"
    other.write_text(other.read_text() + "# an edit to a task no warm start demonstrates\n")
    assert warm_start.warm_start_key(config) == base
    own = copy / "054-key-sequence.yaml"
    own.write_text(own.read_text() + "# an edit to the demonstrated task\n")
    assert warm_start.warm_start_key(config) != base


def test_the_key_follows_the_base_models_files(tmp_path, monkeypatch):
    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    cfg = _config(tmp_path / "a", f"actor.path={model}")
    before = warm_start.warm_start_key(cfg)
    (model / "config.json").write_text('{"a": 2}')
    assert warm_start.warm_start_key(cfg) != before


def test_only_a_stamped_build_is_reused_and_a_partial_one_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"   # a base model of the user's (the embedded tiny one: the next test)
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = _config(tmp_path / "a", f"actor.path={model}")
    out = warm_start.warm_start_dir(cfg)
    assert out.parent == tmp_path / "home" / "warm-starts"
    assert warm_start.warm_start_dir(_config(tmp_path / "b", "experiment_name=another", f"actor.path={model}")) \
        == out   # shared
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    assert not warm_start.is_built(out)          # weights without the stamp: a build that did not finish
    (out / warm_start.STAMP).write_text(json.dumps({"key": warm_start.warm_start_key(cfg)}))
    assert warm_start.is_built(out)
    # a built one is returned without running anything (the command would fail: no such config file)
    assert warm_start.ensure_warm_start(cfg, "/nonexistent.yaml", [], tmp_path / "log") == out


def test_a_first_run_takes_the_key_once_the_embedded_model_is_built(tmp_path, monkeypatch):
    """On a fresh machine the embedded tiny model is built on first use. The key names the base weights, so it
    must be taken after that build: taken before (as the learning bench did), it named no weights, and the next
    run, which found them, looked under another key and built the warm start again (8 minutes here)."""
    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    cfg = _config(tmp_path / "a")
    model = Path(cfg.actor.path)
    assert model == tmp_path / "home" / "models" / "tiny-qwen3-vl" and not model.exists()
    without_weights = warm_start.warm_start_key(cfg)
    started = []

    def sft_command(cmd, log_file, env):   # where the SFT command would write: stop before running it
        started.append(next(a.split("=", 1)[1] for a in cmd if a.startswith("sft.output_dir=")))
        raise RuntimeError("not run in this test: tests/sft/test_sft.py runs it")

    monkeypatch.setattr(warm_start, "_run_showing_progress", sft_command)
    with pytest.raises(RuntimeError, match="not run"):
        warm_start.ensure_warm_start(cfg, "/nonexistent.yaml", [], tmp_path / "log")
    assert tiny.is_current(model)
    key = warm_start.warm_start_key(cfg)
    assert key != without_weights
    assert Path(started[0]).name.startswith(f"sft-{key}.partial-"), started


def _pin_of(cfg: CUAConfig, pins: Path, sources: str | None = None) -> Path:
    """A pin of ``cfg`` under ``pins``: the multiturn pin's files with a stamp naming ``cfg``'s settings and
    ``sources`` (default: this clone's)."""
    import shutil

    pin = pins / "mine"
    shutil.copytree(REAL_PINS / "multiturn", pin)
    (pin / warm_start.PINNED).write_text(json.dumps({
        "pin_key": warm_start.pin_key(cfg), "sources": sources or warm_start.sources_hash(cfg), "built": "today",
        "build_seconds": 300.0, "sft": {"loss_before": 11.0}}))
    return pin


def _no_build(monkeypatch) -> list:
    started = []

    def sft_command(cmd, log_file, env):
        started.append(cmd)
        raise RuntimeError("not run in this test: tests/sft/test_sft.py runs it")

    monkeypatch.setattr(warm_start, "_run_showing_progress", sft_command)
    return started


def test_a_first_run_copies_a_pin_of_its_settings_and_sources_and_builds_nothing(tmp_path, monkeypatch):
    """A fresh machine's first run of a pinned recipe starts from the pin (issue 86: the README's run in 12
    minutes, not 20): the same weights where a build would have gone, which the verdict knows by the pin's
    kept score."""
    from cua_rl import verdict

    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    cfg = _config(tmp_path / "a")
    tiny.ensure_embedded_model(cfg)
    monkeypatch.setattr(warm_start, "PINS", tmp_path / "pins")
    pin = _pin_of(cfg, tmp_path / "pins")
    started = _no_build(monkeypatch)
    out = warm_start.ensure_warm_start(cfg, "/nonexistent.yaml", [], tmp_path / "log")
    assert out == warm_start.warm_start_dir(cfg) and warm_start.is_built(out) and not started
    assert (out / "model.safetensors").read_bytes() == (pin / "model.safetensors").read_bytes()
    assert json.loads((out / warm_start.STAMP).read_text())["pinned"] == str(pin)
    assert verdict.kept_score(cfg, ["054"], out).name == verdict.kept_score(cfg, ["054"], pin).name
    # other settings: no pin stands for them, and the run builds without a word about pins
    other = _config(tmp_path / "b", "sft.steps=7")
    assert warm_start.find_pin(other) == (None, "")


def test_a_pin_of_other_sources_is_not_used_and_the_run_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    cfg = _config(tmp_path / "a")
    tiny.ensure_embedded_model(cfg)
    monkeypatch.setattr(warm_start, "PINS", tmp_path / "pins")
    _pin_of(cfg, tmp_path / "pins", sources="0123456789abcdef")
    started = _no_build(monkeypatch)
    with pytest.raises(RuntimeError, match="not run"):
        warm_start.ensure_warm_start(cfg, "/nonexistent.yaml", [], tmp_path / "log")
    assert len(started) == 1
    said = capsys.readouterr().out
    assert "building it" in said and "built from other sources (pinned 0123456789abcdef, this clone " in said, said


def test_the_readme_recipes_pins_stand_for_this_clones_builds():
    """The pinned warm starts match this clone's settings and sources, so a fresh clone's first run copies them
    (the README's 12 minutes). After a change to warm_start.SOURCES: ``python scripts/pin_warm_starts.py
    --restamp`` (it checks that the demonstrations' rows are unchanged) or a re-pin."""
    from cua_rl.run.launch import RECIPES, load_config

    for recipe in ("multiturn", "learn"):
        cfg = load_config(str(RECIPES / f"config.{recipe}.yaml"), [])
        tiny.ensure_embedded_model(cfg)
        pin, why = warm_start.find_pin(cfg)
        assert pin == warm_start.PINS / recipe, (
            f"{recipe}: {why or 'no pin has these settings'}: python scripts/pin_warm_starts.py --restamp {recipe}")
