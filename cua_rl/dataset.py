"""Task sources -> Hugging Face datasets (train, eval) of task rows.

Sources (`task_source.kind`): the gym's task list, a local task file (JSONL, or YAML/JSON list),
explicit ids looked up on the gym, or tasks written in the config (`custom`: the embedded gym serves them). Every task is parsed by `cua_rl.genv.Task.from_raw`, so a
file accepts the same task shapes as a gym (docs/protocols.md §1.2). Several sources (`task_sources`, each
with its own gym, filters, limit, seed and weight) share the training rows by weight; `eval_task_source`
gives the eval tasks instead of the split. Then, for every source (its own setting first, else the run's):

1. keep tasks having any tag of `gym_tags` (case-insensitive: a category is a tag), and of the difficulties in
   `task_source.difficulty`;
2. split: tasks numbered inside `gym_eval_number_range` ("001-032") are eval, the rest train;
   without a range, a seeded shuffle puts `gym_train_ratio` of the tasks into train;
3. `gym_split_type` picks what trains: the train split, the eval split, or all tasks;
4. `gym_limit` caps each split with a seeded sample (order kept).

Rows: task_id, number, name, instruction, description, tags, difficulty, gym_base_url, gym_id. With several gym
hosts (``URL,URL,...``) a row carries them all and the workflow places each group on one of them.
Bad input raises `TaskSourceError` naming the file and line, the gym, or the missing ids.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from pathlib import Path
from typing import Iterable

import yaml
from datasets import Dataset, Features, Sequence, Value

from cua_rl.config import CUAConfig, TaskSourceConfig, parse_number_ranges
from cua_rl.genv import GenvClient, GenvError, Task
from cua_rl.genv.fleet import first_answering, gym_urls

logger = logging.getLogger(__name__)

ROW_FEATURES = Features({
    "task_id": Value("string"),
    "number": Value("int64"),          # None when the task has no number
    "name": Value("string"),
    "instruction": Value("string"),    # what the agent is told to do
    "description": Value("string"),
    "tags": Sequence(Value("string")),
    "difficulty": Value("string"),     # easy/normal/hard from the tags, None when unknown
    "gym_base_url": Value("string"),
    "gym_id": Value("string"),
    "seed_bits": Value("int64"),       # the seeds the gym takes (its task's seed_bits), None when undeclared
})


class TaskSourceError(ValueError):
    """The task source gave nothing usable: empty, malformed, or ids that do not exist."""


# --- reading tasks ------------------------------------------------------------------------------
def read_task_file(path: str | Path) -> list[Task]:
    """Tasks from a .jsonl file (one object per line; blank and '#' lines skipped) or a
    .yaml/.yml/.json file holding a list of tasks or {"tasks": [...]}."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskSourceError(f"cannot read task file {path}: {exc}") from exc
    entries = _jsonl_entries(path, text) if path.suffix == ".jsonl" else _document_entries(path, text)
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    for line, raw in entries:
        try:
            task = Task.from_raw(raw)
        except GenvError as exc:
            raise TaskSourceError(f"{path}:{line}: {exc.detail}") from exc
        if task.id in first_line:
            raise TaskSourceError(f"{path}:{line}: duplicate task id {task.id!r} (first at line {first_line[task.id]})")
        first_line[task.id] = line
        tasks.append(task)
    if not tasks:
        raise TaskSourceError(f"task file {path} holds no tasks")
    return tasks


def _jsonl_entries(path: Path, text: str) -> list[tuple[int, object]]:
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            entries.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise TaskSourceError(f"{path}:{number}: not valid JSON ({exc.msg}, column {exc.colno})") from exc
    return entries


def _document_entries(path: Path, text: str) -> list[tuple[int, object]]:
    """YAML (JSON is YAML too); line numbers come from the node tree."""
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise TaskSourceError(f"task file {path}: unknown format {path.suffix!r} (use .jsonl, .yaml, .yml or .json)")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise TaskSourceError(f"{path}{where}: not valid YAML/JSON ({getattr(exc, 'problem', exc)})") from exc
    if isinstance(data, dict) and "tasks" in data:
        node = next(v for k, v in root.value if k.value == "tasks")
        data = data["tasks"]
    else:
        node = root
    if not isinstance(data, list):
        raise TaskSourceError(f"{path}: expected a list of tasks or a mapping with a 'tasks' list")
    return [(item.start_mark.line + 1, raw) for item, raw in zip(node.value, data)]


def _needs_detail(task: Task) -> bool:
    """A list entry with neither instruction nor description: the agent would get only the name."""
    meta = task.raw.get("meta") if isinstance(task.raw.get("meta"), dict) else {}
    return not any(src.get(k) for src in (task.raw, meta) for k in ("instruction", "description"))


async def fetch_gym_tasks(gym: GenvClient) -> list[Task]:
    """The gym's task list; entries without instruction/description are fetched in full."""
    tasks = await gym.list_tasks()
    if not tasks:
        raise TaskSourceError(f"gym {gym.gym_id!r} at {gym.base_url} lists no tasks")
    incomplete = [i for i, t in enumerate(tasks) if _needs_detail(t)]
    if incomplete:
        logger.info("fetching %d task(s) without instruction in full", len(incomplete))
        full = await asyncio.gather(*(gym.get_task(tasks[i].id) for i in incomplete))
        for i, task in zip(incomplete, full):
            tasks[i] = task
    return tasks


def select_ids(tasks: list[Task], ids: Iterable[str]) -> list[Task]:
    """Tasks for the requested ids, in request order. An id matches a task id, then a name,
    then (when all digits) a task number. Unknown ids are an error, never a silent substitute."""
    by_id = {t.id: t for t in tasks}
    by_name = {t.name: t for t in tasks}
    by_number = {t.number: t for t in tasks if t.number is not None}
    chosen, missing = [], []
    for wanted in ids:
        wanted = str(wanted)
        task = by_id.get(wanted) or by_name.get(wanted)
        if task is None and wanted.isdigit():
            task = by_number.get(int(wanted))
        if task is None:
            missing.append(wanted)
        elif task not in chosen:
            chosen.append(task)
    if missing:
        known = ", ".join(sorted(by_id)[:10])
        raise TaskSourceError(f"task id(s) not found on the gym: {', '.join(missing)} (known ids include: {known})")
    return chosen


# --- filtering and splitting ----------------------------------------------------------------------
def filter_by_tags(tasks: list[Task], tags: Iterable[str] | None) -> list[Task]:
    wanted = {t.strip().lower() for t in (tags or []) if t.strip()}
    if not wanted:
        return list(tasks)
    kept = [t for t in tasks if wanted & {tag.lower() for tag in t.tags}]
    if not kept:
        seen = sorted({tag for t in tasks for tag in t.tags})
        raise TaskSourceError(f"no task has any of the tags {sorted(wanted)}; tags present: {seen}")
    return kept


def filter_by_difficulty(tasks: list[Task], levels: Iterable[str] | None) -> list[Task]:
    wanted = {"normal" if lv.lower() == "medium" else lv.lower() for lv in (levels or [])}
    if not wanted:
        return list(tasks)
    kept = [t for t in tasks if t.difficulty in wanted]
    if not kept:
        seen = sorted({str(t.difficulty) for t in tasks})
        raise TaskSourceError(f"no task has difficulty {sorted(wanted)}; difficulties present: {seen}")
    return kept


def split_tasks(tasks: list[Task], *, eval_number_range: str | None, train_ratio: float,
                seed: int) -> tuple[list[Task], list[Task]]:
    """(train, eval). A number range wins over the ratio; tasks without a number then train."""
    if eval_number_range:
        ranges = parse_number_ranges(eval_number_range)
        def in_range(t: Task) -> bool:
            return t.number is not None and any(lo <= t.number <= hi for lo, hi in ranges)
        unnumbered = sum(t.number is None for t in tasks)
        if unnumbered:
            logger.warning("%d task(s) have no number; they go to the train split", unnumbered)
        return [t for t in tasks if not in_range(t)], [t for t in tasks if in_range(t)]
    # Shuffle a canonical (number, id) order so the split does not depend on the order the gym
    # lists tasks in; each split then keeps the source's order.
    ordered = sorted(tasks, key=lambda t: (t.number is None, t.number or 0, t.id))
    random.Random(seed).shuffle(ordered)
    n = len(ordered)
    n_train = round(n * train_ratio)
    if 0.0 < train_ratio < 1.0 and n >= 2:
        n_train = min(max(n_train, 1), n - 1)  # both splits get at least one task
    train_ids = {t.id for t in ordered[:n_train]}
    return [t for t in tasks if t.id in train_ids], [t for t in tasks if t.id not in train_ids]


def apply_limit(tasks: list[Task], limit: int | None, seed: int) -> list[Task]:
    """At most `limit` tasks, a seeded sample that keeps the original order."""
    if limit is None or len(tasks) <= limit:
        return list(tasks)
    keep = set(random.Random(seed).sample(range(len(tasks)), limit))
    return [t for i, t in enumerate(tasks) if i in keep]


def choose_splits(tasks: list[Task], config: CUAConfig, source: TaskSourceConfig | None = None, *,
                  whole: bool = False) -> tuple[list[Task], list[Task]]:
    """Steps 1-4 of the module docstring: (train tasks, eval tasks), with ``source``'s own tags, limit and seed
    where it sets them. ``whole``: no split (a source beside a separate eval source): (every task, [])."""
    source = source or config.task_source
    tags = source.tags if source.tags is not None else config.gym_tags
    limit = source.limit if source.limit is not None else config.gym_limit
    seed = source.seed if source.seed is not None else config.gym_seed
    tasks = filter_by_difficulty(filter_by_tags(tasks, tags), source.difficulty)
    if whole:
        return apply_limit(tasks, limit, seed), []
    train, evaluation = split_tasks(tasks, eval_number_range=config.gym_eval_number_range,
                                    train_ratio=config.gym_train_ratio, seed=seed)
    if config.gym_split_type == "eval":
        train = evaluation
    elif config.gym_split_type == "all":
        train = list(tasks)
    train = apply_limit(train, limit, seed)
    evaluation = apply_limit(evaluation, limit, seed)
    if not train:
        raise TaskSourceError(
            f"the training split is empty ({len(tasks)} task(s) after the tag filter; "
            f"gym_eval_number_range={config.gym_eval_number_range!r}, gym_train_ratio={config.gym_train_ratio}, "
            f"gym_split_type={config.gym_split_type!r})")
    return train, evaluation


def weighted(parts: list[tuple[float, int, list[dict]]]) -> list[dict]:
    """Training rows of several sources, (weight, repeat, rows) each: as many rows in all as the sources give
    with their repeat, shared in proportion to the weights, each source's rows cycling to fill its share (at
    least one). One source: its rows ``repeat`` times, in order."""
    if len(parts) == 1:
        _, repeat, rows = parts[0]
        return rows * repeat
    total = sum(len(rows) * repeat for _, repeat, rows in parts)
    weights = sum(w for w, _, _ in parts)
    out = []
    for w, _, rows in parts:
        share = max(1, round(total * w / weights))
        out += (rows * -(-share // len(rows)))[:share]
    return out


# --- rows and datasets ---------------------------------------------------------------------------
def task_row(task: Task, gym_base_url: str, gym_id: str) -> dict:
    return {"task_id": task.id, "number": task.number, "name": task.name, "instruction": task.instruction,
            "description": task.description, "tags": list(task.tags), "difficulty": task.difficulty,
            "gym_base_url": gym_base_url, "gym_id": gym_id, "seed_bits": declared_seed_bits(task)}


def declared_seed_bits(task: Task) -> int | None:
    """The task object's ``seed_bits`` (docs/protocols.md 1.2: its gym takes seeds in 0..2**seed_bits-1; what
    the workflow's instance seeds keep within, cua_rl/workflow/seeding.py), None when it declares none."""
    bits = task.raw.get("seed_bits")
    return bits if isinstance(bits, int) and not isinstance(bits, bool) else None


def gym_of(config: CUAConfig, source: TaskSourceConfig) -> tuple[str, str]:
    """The gym a source's tasks run on: its own, else the run's."""
    return source.gym_base_url or config.gym_base_url, source.gym_id or config.gym_id


def own_gym_tasks(gym_id: str, tasks_dir: str = "") -> list[Task]:
    """The tasks our gym serves for ``gym_id`` (its built-in suite, or ``tasks_dir``'s files), read here without
    asking a server: the run's gyms on the Ray cluster start only once the trainer's workers are placed."""
    from cua_rl.local_gym.manager import GymOptions
    from cua_rl.local_gym.suite import make_suite

    folder = str(Path(tasks_dir).expanduser().resolve()) if tasks_dir else None
    return [Task.from_raw(t.to_wire()) for t in make_suite(GymOptions(gym_id=gym_id, tasks_dir=folder)).tasks.tasks]


async def aload_tasks(config: CUAConfig, source: TaskSourceConfig | None = None) -> list[Task]:
    """Every task of ``source`` (default: ``task_source``), before filtering and splitting."""
    source = source or config.task_source
    if source.kind == "file":
        return read_task_file(source.task_file)
    url, gym_id = gym_of(config, source)
    if not url and gym_id and config.gym_fleet.ray_gyms.enabled:
        tasks = own_gym_tasks(gym_id, config.embedded.tasks_dir)   # what our gyms on the Ray cluster will serve
        return select_ids(tasks, source.task_ids) if source.kind in ("ids", "custom") else tasks
    if not url or not gym_id:
        raise TaskSourceError(
            f"task_source.kind={source.kind} needs gym_base_url and gym_id (got {url!r}, {gym_id!r}): pass "
            f"--gym/--gym-id, let launch.py start the embedded gym, or set the source's own gym_base_url/gym_id")
    async def listed(host: str) -> list[Task]:
        async with GenvClient(host, gym_id) as gym:
            return await fetch_gym_tasks(gym)

    try:   # a fleet's hosts serve the same tasks: the first that answers lists them
        tasks = await first_answering(gym_urls(url), listed)
    except GenvError as exc:
        raise TaskSourceError(f"cannot list the tasks of gym {gym_id!r}: {exc}") from exc
    # custom: the tasks written in the config, which the embedded gym serves (task_ids holds their ids)
    return select_ids(tasks, source.task_ids) if source.kind in ("ids", "custom") else tasks


async def aload_task_datasets(config: CUAConfig) -> tuple[Dataset, Dataset | None]:
    """(train dataset, eval dataset or None when there are no eval tasks): ``task_source``, or every source of
    ``task_sources`` combined by weight; the eval tasks from the split, or from ``eval_task_source``."""
    sources, eval_source = list(config.task_sources) or [config.task_source], config.eval_task_source
    parts, evaluation = [], []
    for source in sources:
        url, gym_id = gym_of(config, source)
        train, ev = choose_splits(await aload_tasks(config, source), config, source, whole=eval_source is not None)
        logger.info("task source %s%s: %d train task(s)%s, %d eval task(s)", source.kind,
                    f" ({url} {gym_id})" if len(sources) > 1 else "", len(train),
                    f" x {source.repeat}" if source.repeat > 1 else "", len(ev))
        # rows of one task get different seeds (cua_rl/workflow/seeding.py)
        parts.append((source.weight, source.repeat, [task_row(t, url, gym_id) for t in train]))
        evaluation += [task_row(t, url, gym_id) for t in ev]
    if eval_source is not None:
        url, gym_id = gym_of(config, eval_source)
        ev, _ = choose_splits(await aload_tasks(config, eval_source), config, eval_source, whole=True)
        logger.info("eval task source %s: %d eval task(s)", eval_source.kind, len(ev))
        evaluation = [task_row(t, url, gym_id) for t in ev]
    train_ds = Dataset.from_list(weighted(parts), features=ROW_FEATURES)
    eval_ds = Dataset.from_list(evaluation, features=ROW_FEATURES) if evaluation else None
    return train_ds, eval_ds


def load_task_datasets(config: CUAConfig) -> tuple[Dataset, Dataset | None]:
    """Synchronous `aload_task_datasets` for train.py (call the async one inside an event loop)."""
    return asyncio.run(aload_task_datasets(config))
