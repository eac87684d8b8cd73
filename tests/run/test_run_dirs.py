"""Runs never mix: with trial_name "auto" each launch gets its own timestamped trial; an explicit name whose
run already exists is refused (clear message, nothing deleted) unless existing_run=overwrite, which deletes
that run's logs and checkpoints, or existing_run=resume, which keeps it (and needs it). Checked on the
launcher's own functions with real directories."""

from pathlib import Path

import pytest

from cua_rl.runs import RunPaths, claim_run_dir, new_trial_name, run_exists
from cua_rl.trainer.resume import newest_resumable


def _paths(root: Path, trial: str) -> RunPaths:
    logs = root / "logs" / trial
    return RunPaths(logs=logs, checkpoints=root / "checkpoints" / trial, tensorboard=logs / "tensorboard")


def test_auto_names_are_timestamped_and_never_reuse_a_run(tmp_path):
    now = 1_795_000_000.0
    first = new_trial_name(lambda n: _paths(tmp_path, n), now)
    assert first.startswith("run") and "-" not in first and len(first) == len("run20261122_233500")
    (_paths(tmp_path, first).logs).mkdir(parents=True)
    (_paths(tmp_path, first).logs / "train.log").write_text("x")
    second = new_trial_name(lambda n: _paths(tmp_path, n), now)  # same second, the first one exists
    assert second == first + "_2"


def test_loading_a_config_alone_is_not_a_run(tmp_path):
    p = _paths(tmp_path, "t")
    p.logs.mkdir(parents=True)
    (p.logs / "config.yaml").write_text("saved by load_expr_config")
    p.checkpoints.mkdir(parents=True)  # AReaL's Saver.get_save_root creates it empty
    assert not run_exists(p)
    claim_run_dir(p, "t", "refuse")  # nothing to refuse


def test_an_existing_explicit_trial_is_refused_and_kept(tmp_path):
    p = _paths(tmp_path, "mine")
    (p.tensorboard).mkdir(parents=True)
    p.checkpoints.mkdir(parents=True)
    (p.checkpoints / "weights").write_text("w")
    with pytest.raises(SystemExit, match="already exists.*existing_run=overwrite"):
        claim_run_dir(p, "mine", "refuse")
    assert (p.checkpoints / "weights").exists() and p.tensorboard.exists()


def test_overwrite_deletes_the_old_runs_logs_and_checkpoints(tmp_path):
    p = _paths(tmp_path, "mine")
    (p.tensorboard).mkdir(parents=True)
    p.checkpoints.mkdir(parents=True)
    other = _paths(tmp_path, "other")
    other.checkpoints.mkdir(parents=True)
    claim_run_dir(p, "mine", "overwrite")
    assert not p.logs.exists() and not p.checkpoints.exists() and other.checkpoints.exists()


def test_existing_run_is_validated_at_load(tmp_path):
    from cli_cases import load

    with pytest.raises(Exception, match="existing_run"):
        load(tmp_path, "existing_run=keep")
    cfg = load(tmp_path)
    assert cfg.trial_name == "auto"
    # RunPaths names AReaL's directories for another trial without creating anything
    before = sorted(tmp_path.rglob("*"))
    p = RunPaths.of(cfg, "run20260101_000000")
    assert p.logs.name == p.checkpoints.name == "run20260101_000000" and sorted(tmp_path.rglob("*")) == before


def test_resume_keeps_an_existing_run_and_needs_one(tmp_path):
    p = _paths(tmp_path, "mine")
    with pytest.raises(SystemExit, match="--resume: there is no run named 'mine'"):
        claim_run_dir(p, "mine", "resume")
    p.checkpoints.mkdir(parents=True)
    (p.checkpoints / "weights").write_text("w")
    claim_run_dir(p, "mine", "resume")
    assert (p.checkpoints / "weights").exists()


def test_resume_without_a_name_picks_the_newest_committed_run(tmp_path):
    import os

    experiment = tmp_path / "checkpoints"
    assert newest_resumable(experiment) is None
    for name, mtime in (("old", 1_000), ("new", 2_000), ("uncommitted", 3_000)):
        info = experiment / name / "recover_info"
        info.mkdir(parents=True)
        (info / "step_info.json").write_text("{}")
        if name != "uncommitted":
            (info / "COMMIT.json").write_text("{}")
            os.utime(info / "COMMIT.json", (mtime, mtime))
    assert newest_resumable(experiment) == "new"


def test_choosing_the_cpu_config_for_a_given_gym_leaves_no_learning_recipe_directory(tmp_path):
    """Without a GPU the launcher loads config.multiturn.yaml to ask whether the run is embedded; with a gym given
    it is not, and that load's log directory (config.yaml only) must not stay behind as a second run."""
    from cua_rl.run import cli
    from cua_rl.run.launch import choose_config

    request = cli.Request(overrides=["gym_base_url=http://127.0.0.1:9", "gym_id=desktop", "trial_name=mine",
                                     f"cluster.fileroot={tmp_path}"])
    path, _, config = choose_config(request, gpu=False)
    assert path.endswith("config.cpu.yaml") and not config.experiment_name.startswith("cua-learn")
    experiments = {p.name for p in tmp_path.glob("logs/*/*")}
    assert "cua-learn-multiturn" not in experiments and config.experiment_name in experiments
