"""Task definitions: YAML files under ``local_gym/tasks/`` (one per task), loaded into typed models.

A task says what the agent is told (instruction), what the desktop starts with (files, folders, apps),
how it is scored (weighted validators reading real state in the execution's HOME), and a reference
solution (desktop actions) that the tests play through the HTTP API to prove the task is solvable.

A task whose ``setup`` has ``vm`` runs on a QEMU machine booted from that image instead (``vm/backend.py``):
its ``files``/``dirs`` are guest paths (relative ones under ``vm.home``), ``commands`` run in the guest
through its agent, and its validators read the guest's files. An X11 task's ``files``/``dirs`` follow the
validators' rule for paths under HOME (``home_paths.home_parts``: relative, no ``..``): a task that breaks it is
refused when it loads, since the gym writes them as root.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .apps import APPS
from .curriculum import FAMILIES, SEED_BITS
from .desktop import AppLaunch, DesktopSpec
from .fork import MAX_MASK, mask_share
from .home_paths import home_file_parts
from .validators import ValidatorSpec
from .vm.backend import GUEST_OSES, VMDesktopSpec
from .vm.machine import VMSpec

TASKS_DIR = Path(__file__).parent / "tasks"
CATEGORIES = ("text_editor", "file_manager", "terminal", "app_settings", "multi_step", "curriculum")
DIFFICULTIES = ("easy", "normal", "hard")


class AppSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    app: str
    args: list[str] = []
    geometry: tuple[float, float, float, float] | None = None  # x, y, w, h as fractions; None = maximised

    @field_validator("app")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in APPS:
            raise ValueError(f"unknown app {v!r}; known: {sorted(APPS)}")
        return v


def _image_path(value: str | None) -> str | None:
    """An image path with ``~`` and ``$VARS`` expanded; it must be an existing file."""
    if value is None:
        return None
    path = os.path.expandvars(os.path.expanduser(value))
    unset = re.findall(r"\$\{?(\w+)", path)
    if unset:
        raise ValueError(f"{value!r}: environment variable {unset[0]} is not set")
    if not os.path.isabs(path):
        raise ValueError(f"{value!r}: VM image paths must be absolute (after ~ and $VAR expansion)")
    if not os.path.isfile(path):
        raise ValueError(f"VM image {path} does not exist")
    return path


class VMSetup(BaseModel):
    """The machine a VM task runs on. ``image`` is the user's disk (qcow2, raw, ...; never written);
    ``kernel``/``initrd``/``append`` boot a Linux kernel directly (the test guest) instead of the disk's
    boot loader. The first boot may take ``boot_timeout_s`` (Windows under TCG: many minutes); it happens
    once per gym, later executions resume its saved state."""

    model_config = ConfigDict(extra="forbid")
    image: str
    kernel: str | None = None
    initrd: str | None = None
    append: str = ""
    memory_mib: int = Field(2048, ge=64, le=1 << 20)
    cpus: int = Field(1, ge=1, le=64)
    accel: list[str] = ["kvm", "tcg"]
    os: str = "linux"
    home: str | None = None            # relative guest paths are under it; default /root or C:\Users\Public
    boot_timeout_s: float = Field(600.0, gt=0)
    settle_s: float = Field(2.0, ge=0)

    @field_validator("image", "kernel", "initrd")
    @classmethod
    def _exists(cls, v: str | None) -> str | None:
        return _image_path(v)

    @field_validator("os")
    @classmethod
    def _os(cls, v: str) -> str:
        if v not in GUEST_OSES:
            raise ValueError(f"os must be one of {GUEST_OSES}")
        return v

    @field_validator("accel")
    @classmethod
    def _accel(cls, v: list[str]) -> list[str]:
        if not v or any(a not in ("kvm", "tcg") for a in v):
            raise ValueError("accel is a non-empty list of kvm and tcg, in order of preference")
        return v

    def desktop_spec(self, files, dirs) -> VMDesktopSpec:
        home = self.home or ("C:\\Users\\Public" if self.os == "windows" else "/root")
        vm = VMSpec(base_image=self.image, memory_mib=self.memory_mib, cpus=self.cpus, kernel=self.kernel,
                    initrd=self.initrd, append=self.append, accel=tuple(self.accel))
        return VMDesktopSpec(apps=(), files=files, dirs=dirs, vm=vm, guest_os=self.os, guest_home=home,
                             boot_timeout_s=self.boot_timeout_s, settle_s=self.settle_s)


class Setup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: dict[str, str] = {}
    dirs: list[str] = []
    apps: list[AppSpec] = []            # an X11 desktop's apps (at least one) ...
    vm: VMSetup | None = None           # ... or the VM the task runs on (no apps)
    commands: list[list[str]] = []      # VM tasks: argv lists run in the guest after files are written

    @model_validator(mode="after")
    def _desktop_or_vm(self) -> "Setup":
        if self.vm is None and not self.apps:
            raise ValueError("setup needs apps (an X11 desktop) or vm (a VM image)")
        if self.vm is not None and self.apps:
            raise ValueError("a VM task has no apps: the guest image brings its own")
        if self.commands and self.vm is None:
            raise ValueError("setup commands run inside a VM guest; X11 tasks start apps instead")
        if any(not argv or not all(isinstance(a, str) and a for a in argv) for argv in self.commands):
            raise ValueError("each setup command is a non-empty list of non-empty strings (argv)")
        if self.vm is None:   # the gym writes them as root into the desktop's HOME: the validators' rule holds
            for where, paths in (("files", self.files), ("dirs", self.dirs)):
                for path in paths:
                    try:
                        home_file_parts(path)
                    except ValueError as exc:
                        raise ValueError(f"setup {where}: {exc}") from None
        return self


class TaskDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    number: str
    name: str
    category: str
    difficulty: str
    instruction: str
    setup: Setup
    validators: list[ValidatorSpec] = []
    solution: list[dict] = []
    answer: str | None = None            # the reference solution's final answer, for answer_matches tasks
    tags: list[str] = []                 # listed after difficulty and category (a task source's tag filter)
    # A seeded family (curriculum.py): the instance, its instruction, validators and solution come from
    # create's seed; the task's own instruction describes the family and it has no fixed validators.
    family: str | None = None
    # Forks (fork.py): whether a replay of its actions reaches one state (false: a fork is refused with
    # fork_note, the reason), and the screen regions where its apps draw on their own (a clock, a spinner:
    # fractions x0, y0, x1, y1; at most 2 % of the screen), which a fork's children may differ in.
    forkable: bool = True
    fork_note: str | None = None
    volatile: list[tuple[float, float, float, float]] = []

    @model_validator(mode="after")
    def _family_or_fixed(self) -> "TaskDef":
        if self.family is None:
            if not self.validators or not self.solution:
                raise ValueError("a task needs validators and a solution (or a seeded family)")
            return self
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; known: {sorted(FAMILIES)}")
        if self.validators or self.solution:
            raise ValueError("a family task takes its validators and solution from the seeded instance")
        return self

    @model_validator(mode="after")
    def _fork_fields(self) -> "TaskDef":
        if not self.forkable and not (self.fork_note or "").strip():
            raise ValueError("a task marked forkable: false says why in fork_note")
        for region in self.volatile:
            x0, y0, x1, y1 = region
            if not (0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1):
                raise ValueError(f"a volatile region is x0, y0, x1, y1 with 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1, "
                                 f"got {list(region)}")
        share = mask_share(self.volatile)
        if share > MAX_MASK:
            raise ValueError(f"volatile regions cover {share:.1%} of the screen; at most {MAX_MASK:.0%}")
        return self

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        bad = [t for t in v if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", t)]
        if bad:
            raise ValueError(f"tags are words of letters, digits, '_', '.' and '-'; got {bad}")
        return v

    @field_validator("number")
    @classmethod
    def _number(cls, v: str) -> str:
        if not re.fullmatch(r"\d{3}", v):
            raise ValueError("number must be three digits, e.g. '001'")
        return v

    @field_validator("category")
    @classmethod
    def _category(cls, v: str) -> str:
        if v not in CATEGORIES:
            raise ValueError(f"category must be one of {CATEGORIES}")
        return v

    @field_validator("difficulty")
    @classmethod
    def _difficulty(cls, v: str) -> str:
        if v not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {DIFFICULTIES}")
        return v

    @property
    def task_id(self) -> str:
        return f"{self.number}-{self.name}"

    def desktop_spec(self, width: int, height: int) -> DesktopSpec:
        if self.setup.vm is not None:   # the guest decides its screen size
            return self.setup.vm.desktop_spec(tuple(sorted(self.setup.files.items())), tuple(self.setup.dirs))
        files = dict(self.setup.files)
        for a in self.setup.apps:
            files.update(APPS[a.app].files)
        return DesktopSpec(
            apps=tuple(AppLaunch(a.app, tuple(a.args), a.geometry) for a in self.setup.apps),
            files=tuple(sorted(files.items())), dirs=tuple(self.setup.dirs),
            width=width, height=height)

    def to_wire(self) -> dict:
        """The genv task object (docs/protocols.md §1.2); the reference solution stays server-side."""
        return {
            "task_id": self.task_id, "id": self.task_id, "task_number": self.number, "name": self.name,
            "description": self.instruction, "instruction": self.instruction,
            "tags": [self.difficulty, self.category, *self.tags] + (["seeded"] if self.family else []),
            "category": self.category, "difficulty": self.difficulty,
            "env_config": ({"type": "vm", "os": self.setup.vm.os, "image": os.path.basename(self.setup.vm.image)}
                           if self.setup.vm is not None else
                           {"type": "desktop", "apps": [a.app for a in self.setup.apps],
                            **({"family": self.family} if self.family else {})}),
            "evaluation": {"validators": [v.model_dump(exclude_none=True) for v in self.validators]},
            "forkable": self.forkable or self.setup.vm is not None, "seed_bits": SEED_BITS,
        }


class TaskSet:
    """All tasks, looked up by id ("001-name"), number ("001" or "1") or name."""

    def __init__(self, tasks: list[TaskDef]) -> None:
        self.tasks = sorted(tasks, key=lambda t: t.number)
        self._by_key: dict[str, TaskDef] = {}
        for t in self.tasks:
            for key in (t.task_id, t.number, t.name, str(int(t.number))):
                if key in self._by_key and self._by_key[key] is not t:
                    raise ValueError(f"duplicate task key {key!r}")
                self._by_key[key] = t

    def get(self, key: str) -> TaskDef | None:
        return self._by_key.get(key)

    def __len__(self) -> int:
        return len(self.tasks)


def inline_tasks(entries: list, where: str = "custom task") -> list[TaskDef]:
    """Tasks written inline (a training config's ``task_source.kind: custom``), each in a task file's schema and
    validated as one is; a bad entry is an error naming it (``where`` [i] and its id when it has one)."""
    tasks = []
    for i, entry in enumerate(entries):
        name = f"{where} [{i}]" + (f" ({entry.get('number')}-{entry.get('name')})" if isinstance(entry, dict) else "")
        if not isinstance(entry, dict):
            raise ValueError(f"{name}: a task is a mapping (number, name, category, difficulty, instruction, setup, "
                             f"validators), got {type(entry).__name__}")
        try:
            tasks.append(TaskDef.model_validate(entry))
        except Exception as exc:
            raise ValueError(f"{name}: {exc}") from exc
    return tasks


def load_tasks(directory: Path | str = TASKS_DIR, extra: list | None = None) -> TaskSet:
    """Load and validate every ``*.yaml`` in ``directory``, and the tasks written inline in ``extra``
    (``inline_tasks``); a bad file is an error naming the file, a number or name used twice one naming the key."""
    tasks = []
    for path in sorted(Path(directory).glob("*.yaml")):
        try:
            tasks.append(TaskDef.model_validate(yaml.safe_load(path.read_text())))
        except Exception as exc:
            raise ValueError(f"bad task file {path.name}: {exc}") from exc
    return TaskSet(tasks + inline_tasks(extra or []))
