"""The keyboard suite: the Windows computer-use example's tasks (Slime on Modal) on our desktops and VM guest.

Why: that example trains a keyboard-only policy (``<action>sendkey ...</action>``, ``<action>type ...</action>``,
``<done/>``; our ``keyboard`` agent format) on 50 sentences over four levels, with a train/test split and
checkers that give partial credit (0, 0.2, 0.5, 1.0). Here the same suite runs where we can run it: mousepad and
xterm stand in for Notepad and PowerShell on the X11 desktops, and busybox ``vi`` and ``sh`` on the VM backend's
test guest (``vm/guest_image.py``). A Windows guest stays documented (docs/local_gym.md), not tested here.

One generator, ``suite_tasks(target)``: sentence ``i`` (of ``SENTENCES``) gives task ``i`` of either target, its
level ``i % 4 + 1`` and its split (every fifth sentence is a test task: 40 train, 10 test, every level in both).
The levels:

1. ``editor``: type the sentence in the editor and save it as ``output.txt`` (Notepad, ``C:\\output.txt``);
2. ``filename``: the same, saved under a name the instruction gives (the example's custom file name);
3. ``shell``: in the shell, one of: the sentence into a file, today's date in a stated format (the example's
   ``date_format`` checker), the names of the folders in ``projects`` (its ``has_windows_dirs``);
4. ``multi``: a folder, then a file in it whose first line is step 1 and second line step 2 (its
   ``has_step1_step2``).

Both targets get the same validators, the same instructions up to where things are (``your home folder`` or
``/root``) and the same tags: ``keyboard``, ``level-N``, ``train`` or ``test`` (``task_source.tags`` picks a
split; the levels are also easy / normal / normal / hard). Partial credit is the validators' weights: a file that
exists scores 0.2, one that holds the sentence among other text 0.5, the exact text 1.0; each listed folder and
each step in order count on their own.

``cua-gym suite keyboard --target desktop --out DIR`` writes the tasks as task files (``cua-gym serve --tasks-dir
DIR`` serves them; docs/local_gym.md, "The keyboard suite").
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

LEVELS = ("editor", "filename", "shell", "multi")
TARGETS = ("desktop", "vm")
DIFFICULTY = {"editor": "easy", "filename": "normal", "shell": "normal", "multi": "hard"}
CATEGORY = {"editor": "text_editor", "filename": "text_editor", "shell": "terminal", "multi": "multi_step"}
TEST_EVERY = 5                      # sentence i is a test task when i % TEST_EVERY == TEST_EVERY - 1
FIRST_NUMBER = {"desktop": 101, "vm": 201}
SHELL_KINDS = ("echo", "date", "folders")
DATE_FORMATS = (("%Y-%m-%d", "YYYY-MM-DD"), ("%d.%m.%Y", "DD.MM.YYYY"), ("%m/%d/%Y", "MM/DD/YYYY"))
# The test guest (scripts/build_vm_test_image.sh), as examples/vm_tasks/901-vm-shell-files.yaml boots it.
VM_GUEST = {"image": "$CUA_RL_VM_TEST_GUEST/base.qcow2", "kernel": "$CUA_RL_VM_TEST_GUEST/vmlinuz",
            "initrd": "$CUA_RL_VM_TEST_GUEST/initrd.gz", "append": "console=ttyS0 console=tty0 quiet",
            "memory_mib": 256, "accel": ["tcg"], "settle_s": 1}

# Plain ASCII without quotes or shell specials: each is typed into an editor and inside '...' in a shell.
SENTENCES = (
    "Hello world.",
    "The sun is bright today.",
    "Buy milk and bread.",
    "Meeting moved to Friday.",
    "Water the plants every morning.",
    "The train leaves at nine.",
    "Call the dentist before noon.",
    "Our team won the final match.",
    "Please send the report by Monday.",
    "Cats sleep for most of the day.",
    "The library opens at ten on weekdays.",
    "Remember to back up the laptop tonight.",
    "Fresh coffee makes a good start.",
    "The river flows north through the valley.",
    "Pack a warm coat for the mountain trip.",
    "Invoices are due at the end of the month.",
    "A quiet room helps me think clearly.",
    "The new printer is on the second floor.",
    "Add three eggs, flour and a cup of milk.",
    "Our flight lands in Lisbon at six.",
    "Keep the spare keys in the blue drawer.",
    "The garden needs rain after this dry week.",
    "Update the budget sheet with the new totals.",
    "Music from the open window filled the street.",
    "Check the tyre pressure before the long drive.",
    "The museum shows old maps of the harbour.",
    "Every Tuesday the market sells fresh fish.",
    "Turn off the lights when you leave the office.",
    "The kettle whistled while the rain tapped on the roof.",
    "Draft the agenda and share it with the whole team.",
    "A small boat drifted slowly across the calm lake.",
    "The server restarts at midnight for maintenance.",
    "Bring two pens, a notebook and your badge tomorrow.",
    "The children built a tall tower out of wooden blocks.",
    "Renew the domain name before it expires in June.",
    "Snow covered the hills and the roads were closed.",
    "The recipe calls for honey, lemon and fresh ginger.",
    "Write the test plan first, then fix the failing build.",
    "Stars were visible above the quiet village at night.",
    "Return the borrowed books to the library by Thursday.",
    "The orchestra tuned their instruments before the concert began.",
    "Label every box with the room it belongs to.",
    "A strong wind shook the windows of the old farmhouse.",
    "Forward the signed contract to the legal department today.",
    "The bakery on the corner sells warm bread at dawn.",
    "Measure twice and cut once when building the shelf.",
    "Our neighbours planted apple trees along the fence.",
    "The lecture covers sorting, searching and simple graphs.",
    "Schedule the backup job to run every night at two.",
    "Thank you for helping me move the heavy sofa upstairs.",
)


def level_of(i: int) -> str:
    return LEVELS[i % len(LEVELS)]


def split_of(i: int) -> str:
    return "test" if i % TEST_EVERY == TEST_EVERY - 1 else "train"


def shell_kind(i: int) -> str:
    """Which of ``SHELL_KINDS`` a level-3 task ``i`` is."""
    return SHELL_KINDS[(i // len(LEVELS)) % len(SHELL_KINDS)]


def _words(sentence: str) -> list[str]:
    """The sentence's distinct lowercase words of 4+ letters, in order (folder and file names)."""
    seen: list[str] = []
    for w in re.findall(r"[A-Za-z]+", sentence.lower()):
        if len(w) >= 4 and w not in seen:
            seen.append(w)
    return seen


def _text_checks(path: str, sentence: str) -> list[dict]:
    """The example's ``exact_match`` with partial credit: exists 0.2, holds the sentence 0.5, exactly it 1.0."""
    return [{"id": "exists", "type": "file_exists", "path": path, "weight": 1.0},
            {"id": "holds-sentence", "type": "file_contains", "path": path, "text": sentence, "weight": 1.5},
            {"id": "exact", "type": "file_equals", "path": path, "text": sentence + "\n", "weight": 2.5}]


def _type(text: str) -> dict:
    return {"type": "type", "text": text}


def _key(*keys: str) -> dict:
    return {"type": "key", "keys": list(keys)}


def _wait(ms: int) -> dict:
    return {"type": "wait", "ms": ms}


def _editor_solution(vm: bool, name: str, sentence: str) -> list[dict]:
    if vm:   # busybox vi on the console (the shell starts in /): insert, type, escape, write and quit
        return [_type(f"vi /root/{name}\n"), _wait(500), _type("i"), _type(sentence), _key("escape"),
                _type(":wq\n"), _wait(300)]
    # GTK's Save As opens with an empty name and Save insensitive; Save turns sensitive by a timer of GTK's own
    # 150 ms after the name's last edit. The gym holds an Enter after typing until the editor has taken the
    # name and run that timer (actions.enter_gap), however busy the editor is, so one Enter saves.
    return [_type(sentence), _key("ctrl", "s"), _wait(1200), _key("ctrl", "a"), _type(name), _wait(600),
            _key("enter"), _wait(500)]


def _shell(i: int, sentence: str) -> tuple[str, dict, list[dict], list[str]]:
    """Level 3: (instruction, setup extras, validators, shell lines)."""
    kind = shell_kind(i)
    if kind == "echo":
        return (f'write the sentence "{sentence}" as the only line of the file shell.txt', {},
                _text_checks("shell.txt", sentence), [f"echo '{sentence}' > shell.txt"])
    if kind == "date":
        fmt, shown = DATE_FORMATS[(i // (len(LEVELS) * len(SHELL_KINDS))) % len(DATE_FORMATS)]
        return (f"write today's date in the format {shown} as the only line of the file date.txt", {},
                [{"id": "exists", "type": "file_exists", "path": "date.txt", "weight": 1.0},
                 {"id": "date", "type": "file_date", "path": "date.txt", "date_format": fmt, "weight": 4.0}],
                [f"date +{fmt} > date.txt"])
    names = _words(sentence)[:3]
    checks = [{"id": "exists", "type": "file_exists", "path": "folders.txt", "weight": 1.0}]
    checks += [{"id": f"names-{n}", "type": "file_contains", "path": "folders.txt", "text": n,
                "weight": 4.0 / len(names)} for n in names]
    return ("write the names of the folders inside the folder projects, one per line, into the file folders.txt",
            {"dirs": [f"projects/{n}" for n in names]}, checks, ["ls projects > folders.txt"])


def _multi(i: int, sentence: str) -> tuple[str, list[dict], list[str]]:
    """Level 4: (instruction, validators, shell lines)."""
    words = sentence.rstrip(".").split()
    half = len(words) // 2
    steps = [f"step 1: {' '.join(words[:half])}", f"step 2: {' '.join(words[half:])}"]
    folder = _words(sentence)[0]
    path = f"{folder}/steps.txt"
    instruction = (f'create the folder {folder}, then the file {path} whose first line is "{steps[0]}", '
                   f'then add "{steps[1]}" as its second line')
    checks = [{"id": "folder", "type": "dir_exists", "path": folder, "weight": 1.0},
              {"id": "steps", "type": "file_ordered", "path": path, "steps": steps, "weight": 3.0}]
    return instruction, checks, [f"mkdir {folder}", f"echo '{steps[0]}' > {path}", f"echo '{steps[1]}' >> {path}"]


def suite_task(target: str, i: int) -> dict:
    """Task ``i`` (0..49) of the suite on ``target`` ("desktop" | "vm"), as a task-file mapping (``TaskDef``)."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if not 0 <= i < len(SENTENCES):
        raise ValueError(f"task index must be within 0..{len(SENTENCES) - 1}, got {i}")
    sentence, level = SENTENCES[i], level_of(i)
    vm = target == "vm"
    home = "/root" if vm else "your home folder"
    setup: dict = {"vm": dict(VM_GUEST)} if vm else {}
    if level in ("editor", "filename"):
        name = "output.txt" if level == "editor" else f"{_words(sentence)[-1]}.txt"
        editor = "the editor vi (in the shell on the screen)" if vm else "the text editor"
        instruction = f'Using {editor}, write the sentence "{sentence}" and save it as {name} in {home}.'
        validators, solution = _text_checks(name, sentence), _editor_solution(vm, name, sentence)
        if not vm:
            setup["apps"] = [{"app": "mousepad"}]
    else:
        if level == "shell":
            task, extra, validators, lines = _shell(i, sentence)
            setup.update(extra)
        else:
            task, validators, lines = _multi(i, sentence)
        shell = "the shell on the screen" if vm else "the terminal"
        instruction = f"Using {shell}, in {home}: {task}."
        solution = [_type(line + "\n") for line in (["cd /root"] if vm else []) + lines] + [_wait(300)]
        if not vm:
            setup["apps"] = [{"app": "xterm"}]
    number = FIRST_NUMBER[target] + i
    return {"number": f"{number:03d}", "name": f"keys-{'vm-' if vm else ''}{level}-{i:02d}",
            "category": CATEGORY[level], "difficulty": DIFFICULTY[level], "instruction": instruction,
            "tags": ["keyboard", f"level-{LEVELS.index(level) + 1}", split_of(i)],
            "setup": setup, "validators": validators, "solution": solution}


def suite_tasks(target: str, split: str | None = None) -> list[dict]:
    """Every task of the suite on ``target``, or those of one split ("train" | "test")."""
    if split not in (None, "train", "test"):
        raise ValueError(f"split must be train, test or None, got {split!r}")
    return [suite_task(target, i) for i in range(len(SENTENCES)) if split in (None, split_of(i))]


def write_suite(target: str, out_dir: Path | str) -> list[Path]:
    """The suite on ``target`` as task files in ``out_dir`` (created; the suite's own files replaced), checked
    by the gym's task loader before anything is written."""
    from .tasks import inline_tasks

    tasks = suite_tasks(target)
    inline_tasks(tasks, f"keyboard suite ({target})")   # a generator defect fails here, not in the gym
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for task in tasks:
        path = out / f"{task['number']}-{task['name']}.yaml"
        head = (f"# The keyboard suite ({target}), level {task['tags'][1][-1]}, {task['tags'][2]} split: generated by "
                f"cua_rl/local_gym/keyboard_suite.py\n")
        path.write_text(head + yaml.safe_dump(task, sort_keys=False, width=120))
        paths.append(path)
    return paths
