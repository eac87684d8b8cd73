"""The step line and metrics.jsonl come from the episodes a step trained (cua_rl/trainer/progress.py): the workflow
puts each row's episode outcome into its batch (``episode_columns``), the trainer reads them from the batch it is
about to train, and the commit reports exactly those episodes. Light: no AReaL trainer, no service."""

import io
import json
from contextlib import redirect_stdout

import pytest
import torch

from cua_rl.policy.records import Turn
from cua_rl.runs import EPISODE_REWARD, EPISODE_SHARE, EPISODE_SUCCESS, RunPaths
from cua_rl.trainer.progress import METRICS, StepProgress, read_metrics, read_step_line, step_line, trained_outcome
from cua_rl.trajectory import EpisodeOutcome, group_batch
from cua_rl.workflow.group import episode_columns


def _turn(prompt: list[int], out: list[int]) -> Turn:
    return Turn(prompt_ids=list(prompt), output_ids=list(out), output_logprobs=[-0.1] * len(out),
                output_versions=[0] * len(out), prompt_mm_token_type_ids=[0] * len(prompt))


def _episode(reward: float, success: bool, turns: list[Turn], shaped: float | None = None) -> EpisodeOutcome:
    return EpisodeOutcome(turns=turns, reward=reward if shaped is None else shaped,
                          info={"success": success, "env_reward": reward})


@pytest.mark.parametrize("style", ["individual", "concat"])
def test_each_row_carries_its_episodes_outcome_in_the_batchs_row_order(style):
    chain = [_turn([1, 2], [3]), _turn([1, 2, 3, 4], [5]), _turn([1, 2, 3, 4, 5, 6], [7])]   # a prefix chain
    outcomes = [_episode(1.0, True, chain, shaped=1.2),            # shaped: the column keeps the gym's 1.0
                _episode(0.0, False, [_turn([9], [8]), _turn([7], [6])]),   # not a chain: one row per turn always
                _episode(0.0, False, [])]                                   # no policy turn: no row
    batch = group_batch(outcomes, style=style)
    batch.update(episode_columns(outcomes, style, batch["input_ids"].shape[0]))
    first = 1 if style == "concat" else 3
    assert batch[EPISODE_REWARD].tolist() == [1.0] * first + [0.0, 0.0]
    assert batch[EPISODE_SUCCESS].tolist() == [1.0] * first + [0.0, 0.0]
    assert batch[EPISODE_SHARE].tolist() == pytest.approx([1 / first] * first + [0.5, 0.5])
    # the rows are the episodes' own: the first episode's advantage is the positive one
    assert (batch["rewards"][:first] > 0).all() and (batch["rewards"][first:] < 0).all()
    with pytest.raises(ValueError):   # a layout it does not know is refused, never mislabelled
        episode_columns(outcomes, style, batch["input_ids"].shape[0] + 1)


def test_the_outcome_of_a_batch_is_a_mean_over_episodes_not_rows():
    """Two groups: a 1-turn success and a 3-turn failure each. A mean over rows would give 0.25; over episodes
    it is 0.5."""
    def group():
        outcomes = [_episode(1.0, True, [_turn([1], [2])]),
                    _episode(0.0, False, [_turn([1], [2]), _turn([1], [3]), _turn([1], [4])])]
        batch = group_batch(outcomes)
        batch.update(episode_columns(outcomes, "individual", batch["input_ids"].shape[0]))
        return batch

    outcome = trained_outcome([group(), group()])
    assert outcome == {"episodes": 4, "groups": 2, "rows": 8, "reward": pytest.approx(0.5), "success": pytest.approx(0.5)}
    assert trained_outcome([{"input_ids": torch.zeros(1, 2)}]) is None, "rows of another workflow: no outcome"


def test_each_commit_prints_its_line_and_appends_its_metrics(tmp_path, monkeypatch):
    import time
    from types import SimpleNamespace

    clock = iter([100.0, 100.0, 130.0, 150.0, 172.0])
    monkeypatch.setattr("cua_rl.trainer.progress.time", SimpleNamespace(monotonic=lambda: next(clock), time=time.time))
    progress = StepProgress(tmp_path)
    progress.start(4, 0)
    batch = [{EPISODE_REWARD: torch.tensor([1.0, 0.5]), EPISODE_SUCCESS: torch.tensor([1.0, 0.0]),
              EPISODE_SHARE: torch.tensor([1.0, 1.0])}]
    progress.trained(batch)
    assert progress.stats() == {"trained/episodes": 2.0, "trained/groups": 1.0, "trained/rows": 2.0,
                                "trained/reward": 0.75, "trained/success": 0.5}
    line = progress.committed(0, {"ppo_actor/update/loss/avg": 0.25, "note": "not a number", **progress.stats()})
    assert line == ("[cua-rl] step 1/4: success 0.500, reward 0.750 (2 episodes, 1 group, 2 rows); 30s, elapsed 30s, "
                    "ETA 1m30s")
    progress.trained(batch)
    progress.committed(1, {})
    line = progress.committed(2, {})   # no batch was read for it
    assert line.startswith("[cua-rl] step 3/4: no episode outcome in the trained rows; 22s, elapsed 1m12s, ETA 21s")
    records = read_metrics(tmp_path)
    assert [(r["step"], r["global_step"], r["policy_version"]) for r in records] == [(1, 0, 1), (2, 1, 2), (3, 2, 3)]
    assert records[0]["trained/success"] == 0.5 and records[0]["ppo_actor/update/loss/avg"] == 0.25
    assert "note" not in records[0] and "trained/success" not in records[2]
    with open(tmp_path / METRICS, "a") as f:
        f.write('{"step": 4, "torn')   # a line cut by a kill is skipped
    assert len(read_metrics(tmp_path)) == 3


def test_step_line_without_a_total_and_each_line_read_back():
    assert step_line(2, None, None, 5, 10, None) == "[cua-rl] step 2: no episode outcome in the trained rows; 5s, elapsed 10s"
    outcome = {"episodes": 16, "groups": 4, "rows": 1, "reward": 0.5, "success": 0.625}
    line = step_line(3, 16, outcome, 65.4, 3725, 120)
    assert read_step_line(line) == {"step": 3, "total": 16, "success": 0.625, "reward": 0.5, "episodes": 16,
                                    "groups": 4, "rows": 1, "seconds": 65.0, "elapsed": 3720.0}
    assert read_step_line(step_line(2, None, None, 5, 10, None))["seconds"] == 5.0
    assert read_step_line("[cua-rl] step 1: something else") is None


def _paths(tmp_path) -> RunPaths:
    return RunPaths(logs=tmp_path / "logs", checkpoints=tmp_path / "ckpt" / "run1", tensorboard=tmp_path / "logs" / "tb")


def _summary(paths, **kwargs) -> str:
    from cua_rl.run.summary import print_summary

    out = io.StringIO()
    with redirect_stdout(out):
        print_summary(paths, 12.0, 0, **kwargs)
    return out.getvalue()


def test_the_summary_names_the_final_checkpoint_the_numbering_and_each_steps_values(tmp_path):
    paths = _paths(tmp_path)
    paths.logs.mkdir(parents=True)
    for g in (0, 1, 9, 10):
        d = paths.checkpoints / "default" / f"epoch0epochstep{g}globalstep{g}"
        d.mkdir(parents=True)
        if g != 10:   # a checkpoint being written (no config.json yet) is not the final one
            (d / "config.json").write_text("{}")
    with open(paths.logs / METRICS, "w") as f:
        for step, success in ((1, 0.5), (2, 0.75), (4, 1.0)):
            f.write(json.dumps({"step": step, "trained/success": success, "trained/reward": success}) + "\n")
    text = _summary(paths)
    assert f"final checkpoint: {paths.checkpoints}/default/epoch0epochstep9globalstep9 " in text, text
    assert "success of the episodes each step trained (sampled): steps 1-4: 0.500 0.750 - 1.000" in text
    assert ("console step N = AReaL global_step N-1 = checkpoint ...globalstep{N-1} = monitor step (policy version) "
            "N-1, which step N turned into version N (step 4: globalstep3)") in text
    assert "TensorBoard" not in text.split("statistics:")[0] and "verdict" not in text


def test_the_summary_prints_a_verdict_when_the_run_wrote_one(tmp_path):
    paths = _paths(tmp_path)
    paths.logs.mkdir(parents=True)
    (paths.logs / "verdict.json").write_text(json.dumps({"summary": "learned: held-out 0.62 -> 0.94",
                                                         "lines": ["unseen instances +0.30 [0.21, 0.39]"]}))
    text = _summary(paths)
    assert "[cua-rl] verdict:     learned: held-out 0.62 -> 0.94\n[cua-rl]   unseen instances +0.30 [0.21, 0.39]" in text
    (paths.logs / "verdict.json").write_text("{")
    assert "verdict:     unreadable" in _summary(paths)


def test_the_summarys_commands_work_from_a_fresh_shell(tmp_path):
    """Full paths: a fresh shell's PATH has neither this environment's scripts nor train.sh."""
    import os
    import sys

    from cua_rl import own_command
    from cua_rl.run.launch import train_command

    monitor = own_command("cua-monitor", "cua_rl.monitor")
    assert os.path.isabs(monitor.split()[0]) and os.access(monitor.split()[0], os.X_OK), monitor
    assert own_command("no-such-script", "cua_rl.monitor") == f"{sys.executable} -m cua_rl.monitor"
    assert os.path.isabs(train_command()) and train_command().endswith(("train.sh", "cua-train"))
