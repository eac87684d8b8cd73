"""Resume without losing or repeating data (cua_rl/trainer/resume.py), on AReaL's own data loader and recover handler.

The data stream: AReaL's train loader (``create_dataloader``: DistributedSampler, shuffled per epoch) is
consumed as AReaL's rollout controller does (``cycle_dataloader``, items flattened, a read-ahead of pulled
items in flight, steps taking whichever rollouts finish, here in a seeded random order), and the run is
"killed" at several points, including between recover dumps and in a later epoch, then resumed from the
committed loader state and ledger alone. The committed ledger must show every stream position trained once,
each with the row the uninterrupted shuffle puts there. The negative control: AReaL's own resume (the raw
loader's state at the dump, epochs counted from 0 again) does not continue with the untrained items.

The dump: AReaL's ``RecoverHandler.dump`` made atomic, with a train engine that writes files (the real FSDP
engine's save is covered by tests/e2e/test_resume.py); a dump killed at each stage leaves the last committed
point after ``settle``.
"""

import getpass
import itertools
import json
import os
import random

import pytest
from areal.api.cli_args import RecoverConfig, TrainDatasetConfig
from areal.utils.data import cycle_dataloader
from areal.utils.dataloader import create_dataloader
from datasets import Dataset

from cua_rl.runs import DROPPED_DIR, STREAM_KEY, record_dropped
from cua_rl.trainer import resume
from cua_rl.trainer.resume import ExactlyOnceLoader

ROWS, BATCH, AHEAD = 6, 2, 3   # 6 rows (3 steps an epoch), 2 per step, up to 3 more items pulled ahead


def _loader():
    data = Dataset.from_list([{"task_id": f"t{i}", "row": i} for i in range(ROWS)])
    return create_dataloader(data, rank=0, world_size=1,
                             dataset_config=TrainDatasetConfig(batch_size=BATCH, shuffle=True))


def _shuffles(epochs: int) -> list[list[int]]:
    """The rows of each epoch in the order an uninterrupted run pulls them."""
    loader, order = _loader(), []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        order.append([row["row"] for batch in loader for row in batch])
    return order


class _Run:
    """AReaL's consumption of the train loader: a generator over ``cycle_dataloader`` (a new one per
    process), items pulled up to BATCH + AHEAD ahead, each step trains BATCH finished ones."""

    def __init__(self, loader, items_of=lambda batch: batch):
        self.loader = loader
        self.items = (item for batch in cycle_dataloader(loader) for item in items_of(batch))
        self.in_flight: list[dict] = []

    def step(self, global_step: int) -> list[dict]:
        while len(self.in_flight) < BATCH + AHEAD:
            self.in_flight.append(next(self.items))
        rng = random.Random(global_step)   # rollouts finish out of order
        done = rng.sample(self.in_flight, BATCH)
        for item in done:
            self.in_flight.remove(item)
        return done


def _train(steps: int, kills: dict[int, int], dump_every: int = 1) -> dict:
    """Train ``steps`` steps; at each global step in ``kills`` the process dies after training that many
    more steps past the step's dump check. Returns the last committed ledger."""
    committed = {"state": None, "ledger": None}
    step = 0
    while step < steps:
        loader = _loader()
        if committed["ledger"] is not None:
            loader.load_state_dict(committed["state"])   # what AReaL's recover load does
        stream = ExactlyOnceLoader(loader, committed["ledger"])
        run = _Run(stream)
        step = committed["ledger"]["steps"][-1]["global_step"] + 1 if committed["ledger"] else 0
        while step < steps:
            stream.mark_trained([item[STREAM_KEY] for item in run.step(step)])
            if (step + 1) % dump_every == 0:
                committed = {"state": stream.state_dict(), "ledger": json.loads(json.dumps(stream.ledger(step)))}
                stream.committed(step)
            step += 1
            if kills.pop(step, None) is not None:
                break   # killed: everything after the last commit is lost
    return committed["ledger"]


def _assert_exactly_once(ledger: dict, steps: int) -> None:
    shuffles = _shuffles(steps * BATCH // ROWS + 2)
    assert [s["global_step"] for s in ledger["steps"]] == list(range(steps))
    positions = [p for s in ledger["steps"] for p in s["items"]]
    assert len(positions) == len(set(positions)) == steps * BATCH, positions   # nothing twice
    # nothing skipped: the positions pulled are a prefix, and only the AHEAD items in flight at the end are
    # untrained (a slow rollout may stay in flight for several steps, as in AReaL)
    pulled = range(len(positions) + AHEAD)
    assert set(positions) <= set(pulled) and len(set(pulled) - set(positions)) == AHEAD, sorted(positions)
    for s in ledger["steps"]:
        for position, task in zip(s["items"], s["tasks"]):
            epoch, k = divmod(position, ROWS)
            assert task == f"t{shuffles[epoch][k]}", (position, task)   # the uninterrupted run's row


def test_uninterrupted_run_trains_each_position_once():
    _assert_exactly_once(_train(9, kills={}), 9)


@pytest.mark.parametrize("kills", [{2: 0}, {4: 0, 5: 0}, {7: 0}, {1: 0, 3: 0, 6: 0, 8: 0}])
def test_killed_and_resumed_run_trains_each_position_once(kills):
    """Killed after the dumps of steps in ``kills`` (7: in the third epoch) and resumed each time."""
    _assert_exactly_once(_train(9, kills=dict(kills)), 9)


def test_steps_after_the_last_dump_are_trained_again_not_lost():
    """Dumps every 2 steps; killed after step 5 (dumped after step 4): step 5 is trained again."""
    ledger = _train(10, kills={5: 0}, dump_every=2)
    _assert_exactly_once(ledger, 10)


def test_areals_own_resume_skips_read_ahead_items_and_replays_epoch_0():
    """The negative control: the raw loader's state at the dump is past the read-ahead, and a new process
    counts epochs from 0 again, so AReaL's own resume does not continue with the untrained rows."""
    loader = _loader()
    run = _Run(loader)
    trained = [item["row"] for step in range(4) for item in run.step(step)]   # into epoch 1
    untrained = [item["row"] for item in run.in_flight]
    state = loader.state_dict()
    resumed = _loader()
    resumed.load_state_dict(state)
    after = [item["row"] for item in _Run(resumed).step(4)]
    assert set(untrained) - set(after), (untrained, after)   # in-flight rows are not picked up again
    # and the wrapper over the same run does continue with them
    stream = ExactlyOnceLoader(_loader())
    run = _Run(stream)
    for step in range(4):
        stream.mark_trained([item[STREAM_KEY] for item in run.step(step)])
    missing = {item[STREAM_KEY] for item in run.in_flight}
    state, ledger = stream.state_dict(), json.loads(json.dumps(stream.ledger(3)))
    resumed = _loader()
    resumed.load_state_dict(state)
    rerun = _Run(ExactlyOnceLoader(resumed, ledger))
    first = [next(rerun.items)[STREAM_KEY] for _ in range(len(missing))]
    assert set(first) == missing and trained


# ---- the atomic dump -------------------------------------------------------------------------------------

class _Engine:
    """A train engine whose save writes a file per step into the recover checkpoint (optionally dying
    half-way); the real engine's DCP save is exercised end to end by tests/e2e/test_resume.py."""

    def __init__(self):
        self.step, self.die = 0, False

    def save(self, meta):
        from pathlib import Path

        path = Path(meta.path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "weights").write_text(str(self.step))
        if self.die:
            raise KeyboardInterrupt("killed while writing the checkpoint")
        (path / ".metadata").write_text(str(self.step))


class _State:
    def state_dict(self):
        return {}


def _handler(tmp_path):
    from areal.api import FinetuneSpec
    from areal.utils.recover import RecoverHandler

    config = RecoverConfig(mode="on", experiment_name="e", trial_name="t", fileroot=str(tmp_path), freq_steps=1)
    handler = RecoverHandler(config, FinetuneSpec(total_train_epochs=1, dataset_size=100, train_batch_size=1))
    return resume.atomic_recover_handler(handler)


def _dump(handler, engine, step, loader):
    from areal.api import StepInfo

    engine.step = step
    handler.dump(engine, StepInfo(epoch=0, epoch_step=step, global_step=step, steps_per_epoch=100),
                 _State(), _State(), _State(), loader)


def _committed_step(root):
    point = resume.settle(root)
    weights = (root / "default" / "recover_checkpoint" / "weights").read_text()
    info = json.loads((root / "recover_info" / "step_info.json").read_text())
    assert int(weights) == info["global_step"] == point["global_step"]   # one step's pieces, not a mix
    return point["global_step"]


def test_a_dump_killed_half_way_leaves_the_last_committed_point(tmp_path):
    handler, engine = _handler(tmp_path), _Engine()
    loader = ExactlyOnceLoader(_loader())
    root = tmp_path / "checkpoints" / getpass.getuser() / "e" / "t"
    assert resume.settle(root) is None   # nothing committed yet
    _dump(handler, engine, 0, loader)
    assert _committed_step(root) == 0
    _dump(handler, engine, 1, loader)
    assert _committed_step(root) == 1 and not list(root.rglob("*.prev"))
    engine.die = True
    with pytest.raises(KeyboardInterrupt):
        _dump(handler, engine, 2, loader)
    assert (root / "recover_info.prev").exists()   # killed between set-aside and commit
    assert _committed_step(root) == 1
    assert not list(root.rglob("*.prev"))
    # killed after recover_info was set aside but before the checkpoint was
    handler2 = _handler(tmp_path)
    os.replace(root / "recover_info", root / "recover_info.prev")
    assert _committed_step(root) == 1
    # a dump after the kill carries on from the committed point
    engine.die = False
    _dump(handler2, engine, 2, loader)
    assert _committed_step(root) == 2


def test_resume_is_refused_without_a_readable_committed_point(tmp_path):
    from types import SimpleNamespace

    config = SimpleNamespace(trial_name="t", recover=SimpleNamespace(fileroot=str(tmp_path), experiment_name="e",
                                                                     trial_name="t"))
    with pytest.raises(SystemExit, match="no committed recover point"):
        resume.resume_point(config)
    handler, engine = _handler(tmp_path), _Engine()
    _dump(handler, engine, 0, ExactlyOnceLoader(_loader()))
    point = resume.resume_point(config)
    assert point.global_step == 0 and point.ledger["start"] == 0
    root = tmp_path / "checkpoints" / getpass.getuser() / "e" / "t"
    (root / "recover_info" / "saver_info.json").write_text("{not json")   # AReaL would start again at 0
    with pytest.raises(SystemExit, match="cannot be read"):
        resume.resume_point(config)


def test_a_dropped_item_is_consumed_not_retried(tmp_path):
    """The workflow rejects the group of stream item 1 (too few episodes evaluated) and records it
    (``cua_rl.runs.record_dropped``, as the rollout worker does); the loader counts it consumed: the restart point
    moves on, the ledger stays short, and a resumed run does not run it again. Without the record (the
    negative control) the one dropped item pins the restart point at 0 and the ledger grows at every step."""
    def run(dropped_dir, steps=6):
        stream = ExactlyOnceLoader(_loader(), None, dropped_dir)
        items = (item for batch in cycle_dataloader(stream) for item in batch)
        for step in range(steps):
            trained = []
            while len(trained) < BATCH:
                item = next(items)
                if item[STREAM_KEY] == 1:
                    record_dropped(tmp_path, 1)   # nothing trains it
                    continue
                trained.append(item[STREAM_KEY])
            stream.mark_trained(trained)
            committed = {"state": stream.state_dict(), "ledger": json.loads(json.dumps(stream.ledger(step)))}
            stream.committed(step)
        return committed

    committed = run(tmp_path / DROPPED_DIR)
    ledger = committed["ledger"]
    assert ledger["start"] >= 2 * BATCH and len(ledger["trained"]) + len(ledger["dropped"]) <= BATCH + AHEAD, ledger
    loader = _loader()
    loader.load_state_dict(committed["state"])
    resumed = ExactlyOnceLoader(loader, ledger, tmp_path / DROPPED_DIR)
    first = [item[STREAM_KEY] for item in itertools.islice(
        (item for batch in cycle_dataloader(resumed) for item in batch), ROWS)]
    assert 1 not in first and min(first) >= ledger["start"], first

    pinned = run(None)["ledger"]
    assert pinned["start"] == 0 and len(pinned["trained"]) == 6 * BATCH, pinned
