"""Resume that loses nothing: committed recover points and a data stream that trains each item once.

AReaL 1.0.4 can recover a run (``recover.mode``), but three things in it lose or repeat data, and this
module fixes each where it happens, so ``train.sh --resume`` continues a killed run exactly:

1. **The dump is not atomic.** ``RecoverHandler.dump`` overwrites ``<name>/recover_checkpoint`` (DCP
   weights and optimizer) and ``recover_info/`` in place; a kill half-way leaves a mix of two steps, and
   unreadable info makes AReaL start again at step 0 with only a warning. ``AtomicRecoverHandler`` first
   sets the committed point aside (``*.prev``, two renames), lets AReaL write the new one, then writes
   ``recover_info/COMMIT.json`` (fsync'd, renamed into place) and drops the old one. ``settle`` runs
   before the trainer is built and puts the directories back to the last committed point whatever the kill
   interrupted; ``resume_point`` refuses to go on without one.
2. **Read-ahead items are skipped.** With ``max_head_offpolicyness`` > 0 AReaL pulls the next step's tasks
   from the data loader while this step trains, and rollouts finish out of order, so the loader's position
   at the dump is past items that were never trained: AReaL's resume skips them (NVIDIA-NeMo/RL#3599 lost
   about 30% of its prompts this way). ``ExactlyOnceLoader`` wraps the train loader: every item gets a
   stream index (``STREAM_KEY``, which the workflow copies into its rows), the trainer's ``prepare_batch``
   marks the indices it trains, and the loader state that is dumped is the one before the oldest batch with
   an untrained item; the ledger of trained indices at or after it is committed with the point, and the
   resumed loader skips exactly those.
3. **Epochs restart at 0.** AReaL's ``cycle_dataloader`` counts epochs from 0 in every process, so a run
   resumed in epoch 2 replays epoch 0's shuffle from the middle (rows twice, others never). The wrapper
   keeps the epoch and hands the sampler the true one.

4. **Dropped items pin the restart point.** A group the workflow rejects (too few evaluated episodes) is
   never trained, so the batch holding it would stay "not wholly trained" for ever: the ledger would grow
   at every commit and a resume would re-run every dropped item since. The workflow records each row it
   drops (``cua_rl.runs.record_dropped``: one line in ``<logs>/dropped_stream/``, shared with the trainer
   like the endpoint counts) and the loader counts those items as consumed.

The committed ledger also keeps, per trained step, the stream indices and task ids it trained: the run's
record that nothing was skipped or trained twice (``tests/e2e/test_resume.py`` reads it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cua_rl.runs import DROPPED_DIR, STREAM_KEY, read_dropped

if TYPE_CHECKING:
    from areal.api.cli_args import BaseExperimentConfig


logger = logging.getLogger("cua_rl.trainer.resume")

COMMIT = "COMMIT.json"
LEDGER = "stream.json"
PREV = ".prev"
INFO_DIR = "recover_info"
CKPT_DIR = "recover_checkpoint"


# ---- the committed point on disk ------------------------------------------------------------------------

def save_root(config: BaseExperimentConfig) -> Path:
    """AReaL's ``Saver.get_save_root`` for the recover config, without creating it."""
    import getpass

    r = config.recover
    return Path(f"{r.fileroot}/checkpoints/{getpass.getuser()}/{r.experiment_name}/{r.trial_name}")


def newest_resumable(checkpoints_of_experiment: Path) -> str | None:
    """The trial of this experiment whose last recover point was committed most recently (``--resume``
    without a trial name), or None."""
    commits = list(checkpoints_of_experiment.glob(f"*/{INFO_DIR}/{COMMIT}"))
    if not commits:
        return None
    return max(commits, key=lambda p: p.stat().st_mtime).parent.parent.name


def _checkpoint_dirs(root: Path) -> list[Path]:
    """Every engine's recover checkpoint directory, current or set aside (``default/recover_checkpoint``...)."""
    if not root.is_dir():
        return []
    return sorted(d / CKPT_DIR for d in root.iterdir()
                  if d.is_dir() and d.name != INFO_DIR and not d.name.startswith(INFO_DIR)
                  and ((d / CKPT_DIR).exists() or (d / (CKPT_DIR + PREV)).exists()))


def _prev(path: Path) -> Path:
    return path.with_name(path.name + PREV)


def read_commit(root: Path) -> dict | None:
    """The committed point's record (``global_step``...), or None when ``recover_info`` is not committed."""
    try:
        return json.loads((root / INFO_DIR / COMMIT).read_text())
    except (OSError, ValueError):
        return None


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def settle(root: Path) -> dict | None:
    """Put ``root``'s recover directories back to the last committed point after any interruption of
    ``AtomicRecoverHandler.dump``; returns that point's record, or None when none was ever committed.

    The dump's order is: ``recover_info`` -> ``.prev``, each checkpoint -> ``.prev``, AReaL writes new ones,
    COMMIT, ``.prev`` removed. So a committed ``recover_info`` means the current directories are one point;
    otherwise whatever has a ``.prev`` is put back (a checkpoint without one was never moved)."""
    info = root / INFO_DIR
    if read_commit(root) is not None:
        for d in [_prev(info)] + [_prev(c) for c in _checkpoint_dirs(root)]:
            _remove(d)
        return read_commit(root)
    if _prev(info).exists():
        _remove(info)
        os.replace(_prev(info), info)
        for ckpt in _checkpoint_dirs(root):
            if _prev(ckpt).exists():
                _remove(ckpt)
                os.replace(_prev(ckpt), ckpt)
        logger.warning("the last recover dump in %s was interrupted; back to the committed one", root)
        return read_commit(root)
    return None   # nothing committed: partial directories, if any, are not a point to resume from


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class ResumePoint:
    global_step: int          # the last committed step (0-based); training continues at global_step + 1
    ledger: dict              # ExactlyOnceLoader's state (see ledger())
    root: Path


def resume_point(config: BaseExperimentConfig) -> ResumePoint:
    """The committed point ``--resume`` continues from (after ``settle``), or SystemExit saying why not."""
    from areal.utils.recover import RecoverInfo

    root = save_root(config)
    commit = settle(root)
    if commit is None:
        raise SystemExit(f"--resume: run {config.trial_name!r} has no committed recover point in {root} "
                         f"(it was killed before its first recover dump, or recover.freq_* is off)")
    try:
        RecoverInfo.load(str(root / INFO_DIR))   # AReaL would only warn and start again at step 0
        ledger = json.loads((root / INFO_DIR / LEDGER).read_text())
    except Exception as exc:  # noqa: BLE001 - any unreadable piece means the point cannot be used
        raise SystemExit(f"--resume: the recover point in {root} cannot be read: {exc}") from None
    return ResumePoint(global_step=int(commit["global_step"]), ledger=ledger, root=root)


# ---- the atomic dump -------------------------------------------------------------------------------------

def atomic_recover_handler(handler):
    """``handler`` (AReaL's RecoverHandler, as PPOTrainer built and loaded it) made atomic in place."""
    from areal.utils.recover import RecoverHandler

    class AtomicRecoverHandler(RecoverHandler):
        """AReaL's dump between a set-aside of the committed point and a COMMIT record (module docstring)."""

        def dump(self, engine, step_info, saver, evaluator, stats_logger, dataloader, **kwargs):
            self._set_aside_done = False
            super().dump(engine, step_info, saver, evaluator, stats_logger, dataloader, **kwargs)
            if self.last_step_info is not step_info:
                return   # not due at this step (recover.freq_*): nothing was written
            root = self._root()
            ledger = getattr(dataloader, "ledger", None)
            if ledger is not None:
                _write_atomic(root / INFO_DIR / LEDGER, json.dumps(ledger(step_info.global_step)))
            _write_atomic(root / INFO_DIR / COMMIT, json.dumps(
                {"global_step": step_info.global_step, "epoch": step_info.epoch,
                 "epoch_step": step_info.epoch_step, "time": time.time()}))
            if ledger is not None:
                dataloader.committed(step_info.global_step)
            settle(root)   # drops the set-aside point
            logger.debug("recover point committed after step %d", step_info.global_step + 1)

        def _save_checkpoint(self, engine, name="default", **kwargs):
            if not self._set_aside_done:
                self._set_aside()
                self._set_aside_done = True
            super()._save_checkpoint(engine, name=name, **kwargs)

        def _root(self) -> Path:
            from areal.utils.saver import Saver

            return Path(Saver.get_save_root(self.config.experiment_name, self.config.trial_name,
                                            self.config.fileroot))

        def _set_aside(self) -> None:
            root = self._root()
            if settle(root) is None:   # no committed point: whatever is there is partial
                for d in [root / INFO_DIR] + _checkpoint_dirs(root):
                    _remove(d)
                return
            os.replace(root / INFO_DIR, _prev(root / INFO_DIR))   # first: without it nothing is committed
            for ckpt in _checkpoint_dirs(root):
                if ckpt.exists():
                    os.replace(ckpt, _prev(ckpt))

    handler.__class__ = AtomicRecoverHandler
    handler._set_aside_done = False
    return handler


# ---- the data stream -------------------------------------------------------------------------------------

@dataclass
class _Pulled:
    start: int      # stream index of the batch's first item
    end: int
    epoch: int
    state: dict     # the loader's state_dict() before this batch: loading it yields this batch next


class _EpochOf:
    """The sampler AReaL's ``cycle_dataloader`` sets epochs on: it counts from 0 in every process, so the
    wrapper's own (resumed) epoch is passed on instead."""

    def __init__(self, loader: "ExactlyOnceLoader"):
        self._loader = loader

    def set_epoch(self, _epoch: int) -> None:
        sampler = getattr(self._loader.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self._loader.epoch)


class ExactlyOnceLoader:
    """AReaL's train data loader, with stream indices, a ledger of trained items and the resume state
    before the oldest batch that is not wholly trained (module docstring, point 2)."""

    def __init__(self, loader, ledger: dict | None = None, dropped_dir: str | Path | None = None):
        ledger = ledger or {}
        self.dropped_dir = Path(dropped_dir) if dropped_dir else None
        self._dropped: set[int] = set(ledger.get("dropped", []))
        self.loader = loader
        self.batch_size = loader.batch_size
        self.sampler = _EpochOf(self)
        self.epoch = int(ledger.get("epoch", 0))
        self._next = int(ledger.get("start", 0))
        # trained or dropped before the resume, at or after "start"
        self._skip = set(ledger.get("trained", [])) | set(ledger.get("dropped", []))
        self._trained = set(self._skip)
        self.steps: list[dict] = list(ledger.get("steps", []))   # committed steps, oldest first
        self._pending: list[dict] = []                             # trained since the last commit
        self._pulled: list[_Pulled] = []
        self._tasks: dict[int, str] = {}
        self.untracked = 0   # trained batches whose rows carried no stream index (another workflow)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        it = iter(self.loader)
        while True:
            state = self.loader.state_dict()
            try:
                batch = next(it)
            except StopIteration:
                break
            start, self._next = self._next, self._next + len(batch)
            self._pulled.append(_Pulled(start, self._next, self.epoch, state))
            items = []
            for index, row in enumerate(batch, start):
                if index in self._skip:
                    continue
                self._tasks[index] = str(row.get("task_id")) if isinstance(row, dict) else ""
                items.append({**row, STREAM_KEY: index} if isinstance(row, dict) else row)
            if items:
                yield items
        self.epoch += 1

    def mark_trained(self, indices: list[int]) -> None:
        """The stream indices of one step's batch (the trainer's ``prepare_batch`` returned them)."""
        again = sorted(i for i in indices if i in self._trained)
        if again:
            logger.error("stream items %s were trained twice", again)
        self._trained.update(indices)
        self._pending.append({"items": sorted(indices), "tasks": [self._tasks.get(i, "") for i in sorted(indices)]})

    def mark_dropped(self, indices) -> None:
        """Stream items the workflow dropped (never trained): consumed, so they neither pin the restart point
        nor run again after a resume."""
        self._dropped.update(int(i) for i in indices)

    def _read_dropped(self) -> None:
        if self.dropped_dir is not None:
            self.mark_dropped(read_dropped(self.dropped_dir.parent))

    def _consumed(self, index: int) -> bool:
        return index in self._trained or index in self._dropped

    def _resume_from(self) -> tuple[int, int, dict]:
        self._read_dropped()
        for pulled in self._pulled:
            if any(not self._consumed(i) for i in range(pulled.start, pulled.end)):
                return pulled.start, pulled.epoch, pulled.state
        return self._next, self.epoch, self.loader.state_dict()

    def state_dict(self) -> dict:
        """What AReaL dumps as the loader's state: the loader before the oldest not wholly trained batch."""
        return self._resume_from()[2]

    def ledger(self, global_step: int) -> dict:
        """The committed stream state at ``global_step``: where to restart, what is trained past it, and
        every trained step's items (the pending ones numbered up to ``global_step``)."""
        start, epoch, _ = self._resume_from()
        first = global_step - len(self._pending) + 1
        steps = self.steps + [{"global_step": first + k, **p} for k, p in enumerate(self._pending)]
        return {"start": start, "epoch": epoch, "trained": sorted(i for i in self._trained if i >= start),
                "dropped": sorted(i for i in self._dropped if i >= start),
                "steps": steps, "untracked_batches": self.untracked}

    def committed(self, global_step: int) -> None:
        """The ledger of ``global_step`` is on disk: its pending steps are history, older batches forgotten."""
        self.steps = self.ledger(global_step)["steps"]
        self._pending = []
        start = self._resume_from()[0]
        self._pulled = [p for p in self._pulled if p.end > start]
        self._trained = {i for i in self._trained if i >= start}
        self._dropped = {i for i in self._dropped if i >= start}
        self._tasks = {i: t for i, t in self._tasks.items() if i >= start}


def stream_indices(batch: list[dict[str, Any]]) -> list[int] | None:
    """The stream index of each trajectory of a trained batch (None where a trajectory has none)."""
    out = []
    for traj in batch:
        value = traj.get(STREAM_KEY) if isinstance(traj, dict) else None
        if value is None:
            return None
        if hasattr(value, "to_local"):   # single-controller mode: an RTensor held by the rollout worker
            value = value.to_local()
        out.append(int(value.reshape(-1)[0]))
    return out


def install(trainer, point: ResumePoint | None, logs_dir: str | Path | None = None) -> ExactlyOnceLoader:
    """Make ``trainer`` (built, recover point loaded) dump atomically and feed each stream item once; the
    items the workflow dropped are read from ``logs_dir`` (``cua_rl.runs.record_dropped``)."""
    atomic_recover_handler(trainer.recover_handler)
    loader = ExactlyOnceLoader(trainer.train_dataloader, point.ledger if point else None,
                               Path(logs_dir) / DROPPED_DIR if logs_dir else None)
    trainer.train_dataloader = loader
    actor = trainer.actor
    prepare = actor.prepare_batch

    def prepare_batch(dataloader, *args, **kwargs):
        batch = prepare(dataloader, *args, **kwargs)
        if dataloader is loader:
            indices = stream_indices(batch)
            if indices is None:
                loader.untracked += 1
                if loader.untracked == 1:
                    logger.warning("the workflow's rows carry no %s: a resume may repeat or skip this run's "
                                   "read-ahead items", STREAM_KEY)
            else:
                loader.mark_trained(indices)
        return batch

    actor.prepare_batch = prepare_batch
    return loader
