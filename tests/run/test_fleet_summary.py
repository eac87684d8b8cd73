"""What a fleet of gym hosts leaves in the run's records (cua_rl/workflow/worker.py's counts, cua_rl/runs.py) and
what the summary prints of them: the episodes each host served, one line per drained host with its URL and
counts; drained groups are never lost episodes, so the lost-episode checks (the summary's lost count, the stall
watch's ``infra_lost_share``) never see them. The counts are written and read through the run's files, as the
rollout workers and the launcher do."""

from __future__ import annotations

import collections
from types import SimpleNamespace

from cua_rl.run.summary import print_summary
from cua_rl.runs import RunPaths, read_counts, write_counts
from cua_rl.trainer.health import Health, HealthConfig, StallWatch
from cua_rl.workflow.worker import WorkerState


def _outcome(host: str):
    return SimpleNamespace(info={"gym_host": host, "seconds": 1.0}, turns=[], reward=0.0)


def test_drained_groups_are_counted_per_host_and_never_as_lost(tmp_path, capsys, monkeypatch):
    a, b = "http://10.0.0.1:5010", "http://10.0.0.2:5010"
    monkeypatch.setattr("cua_rl.workflow.worker.DRAINS", collections.Counter({b: 1}))   # this process's drains
    state = WorkerState("train")
    monkeypatch.setattr("cua_rl.workflow.worker.trained_tokens", lambda o: 0)
    state.count_group(2, [], False)
    state.count_use([_outcome(a), _outcome(a)])
    state.count_drained(b, 2)                 # b died with a group of 2 in flight; it was played again on a
    state.count_group(2, [], False)
    state.count_use([_outcome(a), _outcome(a)])
    paths = RunPaths(logs=tmp_path / "logs", checkpoints=tmp_path / "ckpt", tensorboard=tmp_path / "tb")
    write_counts("train", str(paths.logs), state.totals())

    totals = read_counts(paths.logs)
    assert totals["episodes_lost"] == 0 and totals["episodes_drained"] == 2 and totals["groups_drained"] == 1
    print_summary(paths, 10.0, 0)
    out = capsys.readouterr().out
    assert "episodes:    4 evaluated, 0 lost to infrastructure failures" in out, out
    assert f"[cua-rl] gym hosts:   {a} 4 episodes, {b} 0 episodes" in out, out
    assert (f"[cua-rl] gym host drained: {b} (1x): 1 groups with 2 episodes in flight there dropped, never trained, "
            f"and played again on other hosts; 0 episodes evaluated there") in out, out

    # the stall watch reads lost episodes only: drained ones do not make a step look stalled
    watch = StallWatch(paths.logs, Health(HealthConfig(), max_turns=1, max_head_offpolicyness=1), episodes_per_step=1,
                       stall_s=0.0)
    state.count_drained(b, 2)
    state.count_drained(b, 2)
    write_counts("train", str(paths.logs), state.totals())
    assert watch._lost_check() is None


def test_one_gym_prints_no_host_lines(tmp_path, capsys, monkeypatch):
    state = WorkerState("train")
    state.count_group(1, [], False)
    state.count_use([SimpleNamespace(info={"gym_host": "http://g:1", "seconds": 1.0}, turns=[], reward=0.0)])
    paths = RunPaths(logs=tmp_path / "logs", checkpoints=tmp_path / "ckpt", tensorboard=tmp_path / "tb")
    monkeypatch.setattr("cua_rl.workflow.worker.DRAINS", collections.Counter())
    write_counts("train", str(paths.logs), state.totals())
    print_summary(paths, 1.0, 0)
    assert "gym host" not in capsys.readouterr().out
