"""The seeded curriculum: families of short desktop tasks (1-3 actions) whose instance comes from a seed.

Why: a policy can only be seen to learn on tasks it can solve sometimes; the fixed YAML tasks are too long
for a tiny model, and a fixed layout could be solved from the instruction text alone. Here a task names a
*family*; create-execution's ``options.seed`` picks the instance (where the squares are, which colour is
asked for, which word to type), so the same task and seed are the same instance and a policy has to read
the screenshot to find the target.

One definition per instance: ``make_instance(family, seed)`` gives the concrete instruction (returned in
the create reply's ``instruction``, what the agent is told), what the board window draws
(``board.tcl``, run by wish inside the sandbox), the validators that score it (over ``~/.board/events``,
what the window recorded) and the scripted solution (desktop actions) that the tests and the SFT
demonstrations play.

Seeds split into train (``0 .. HELDOUT_START-1``) and held-out (``HELDOUT_START ..``). Every seed the
workflow derives for a group (31 bits) is a training seed; evaluation asks for held-out seeds explicitly
(``seeds("heldout", n)``). Families share one window layout grid, so held-out instances come from the same
distribution as training ones (the MiniWoB++ convention), not from unseen layouts.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from .validators import ValidatorSpec

HELDOUT_START = 2 ** 40
EVENTS = ".board/events"                      # what the window recorded, relative to HOME
GRID = 3                                      # the screen is split into GRID x GRID cells
SQUARE = (0.18, 0.26)                         # a square's width and height as fractions (230x208 px at 1280x800)
BOX = (0.26, 0.1)                             # the text box
JITTER = 0.03                                 # how far a target moves off its cell's centre
# Where a scripted solution clicks in a cell, per axis: inside every item of the cell whatever the jitter
# (|anchor - centre| + JITTER < half of the smallest item, the text box's height). On the 0..1000 grid the
# nine digits of 167, 492, 835 are all different, so a demonstrated coordinate is one choice of leading
# digit per axis and every later digit follows from the one before: a 2-layer model cannot count digits
# ("[14444444]" after SFT on exact item centres, "[512, 12]" when anchors shared a digit) but learns these.
ANCHORS = (0.167, 0.492, 0.835)
COLOURS = {"red": "#e02020", "green": "#20a020", "blue": "#2040e0", "yellow": "#e0c000"}
WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "queen", "robot", "zebra",
         "maple", "ocean", "candle", "garden", "window", "silver")
READY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Item:
    """One thing on the board; position and size are fractions of the screen."""

    kind: str                 # "rect" | "entry" | "keys" (record key presses; no geometry) | "step"
    id: str
    x: float
    y: float
    w: float
    h: float
    colour: str = ""
    key: str = ""             # a "step": the key that moves the board on to the next step

    @property
    def centre(self) -> tuple[float, float]:
        return round(self.x + self.w / 2, 4), round(self.y + self.h / 2, 4)

    def board_line(self) -> str:
        if self.kind == "keys":
            return f"keys {self.id}"
        geometry = f"{self.x:.4f} {self.y:.4f} {self.w:.4f} {self.h:.4f}"
        if self.kind == "step":
            return f"step {self.id} {geometry} {self.colour} {self.key}"
        return f"{self.kind} {self.id} {geometry}" + (f" {self.colour}" if self.colour else "")


@dataclass(frozen=True)
class Instance:
    family: str
    seed: int
    instruction: str
    items: tuple[Item, ...]
    validators: tuple[ValidatorSpec, ...]
    solution: tuple[dict, ...]

    @property
    def split(self) -> str:
        return split_of(self.seed)

    def board_text(self) -> str:
        return "".join(item.board_line() + "\n" for item in self.items)

    def to_wire(self) -> dict:
        """What the create reply says about the instance (never where the target is)."""
        return {"family": self.family, "seed": self.seed, "split": self.split}


# -- seeds ------------------------------------------------------------------------------------------
def split_of(seed: int) -> str:
    return "heldout" if seed >= HELDOUT_START else "train"


def seeds(split: str, n: int, offset: int = 0) -> list[int]:
    """``n`` seeds of ``split`` ("train" or "heldout"), starting ``offset`` into it: fixed lists, so two runs
    evaluate on the same instances."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    base = HELDOUT_START if split == "heldout" else 0
    return [base + offset + i for i in range(n)]


def random_seed() -> int:
    """A training seed for a create without one (returned in the reply, so the instance can be replayed)."""
    return secrets.randbelow(HELDOUT_START)


# -- families ---------------------------------------------------------------------------------------
def _cells(rng: random.Random, k: int) -> list[tuple[int, int]]:
    return rng.sample([(r, c) for r in range(GRID) for c in range(GRID)], k)


def _place(rng: random.Random, cell: tuple[int, int], size: tuple[float, float]) -> tuple[float, float]:
    """Top-left corner of an item of ``size`` centred in ``cell``, moved by up to JITTER."""
    r, c = cell
    cx = (c + 0.5) / GRID + rng.uniform(-JITTER, JITTER)
    cy = (r + 0.5) / GRID + rng.uniform(-JITTER, JITTER)
    return round(cx - size[0] / 2, 4), round(cy - size[1] / 2, 4)


def _events_equal(text: str, vid: str = "exact", weight: float = 1.0) -> ValidatorSpec:
    return ValidatorSpec(id=vid, type="file_equals", path=EVENTS, text=text, weight=weight)


def _click_target(item: Item) -> dict:
    """A click on ``item`` at its cell's anchor point (ANCHORS)."""
    x, y = item.centre
    return {"type": "click", "x": ANCHORS[min(int(x * GRID), GRID - 1)], "y": ANCHORS[min(int(y * GRID), GRID - 1)]}


def _click_square(rng: random.Random) -> tuple[str, list[Item], list[ValidatorSpec], list[dict]]:
    """One red square somewhere on a 3x3 grid: only the screenshot says where."""
    (cell,) = _cells(rng, 1)
    target = Item("rect", "target", *_place(rng, cell, SQUARE), *SQUARE, COLOURS["red"])
    return ("Click the red square.", [target], [_events_equal("click target\n")], [_click_target(target)])


def _click_colour(rng: random.Random) -> tuple[str, list[Item], list[ValidatorSpec], list[dict]]:
    """Four squares of different colours; the instruction names one: text and screenshot are both needed."""
    names = list(COLOURS)
    want = rng.choice(names)
    items = []
    for name, cell in zip(names, _cells(rng, len(names))):
        item_id = "target" if name == want else f"other-{name}"
        items.append(Item("rect", item_id, *_place(rng, cell, SQUARE), *SQUARE, COLOURS[name]))
    target = next(i for i in items if i.id == "target")
    return (f"Click the {want} square.", items, [_events_equal("click target\n")], [_click_target(target)])


def _type_word(rng: random.Random) -> tuple[str, list[Item], list[ValidatorSpec], list[dict]]:
    """A text box somewhere on the grid: click it, type the word, press Enter (3 actions)."""
    word = rng.choice(WORDS)
    (cell,) = _cells(rng, 1)
    box = Item("entry", "box", *_place(rng, cell, BOX), *BOX)
    validators = [ValidatorSpec(id="submitted", type="file_matches", path=EVENTS, pattern=f"^submit box {word}$"),
                  _events_equal(f"click box\nsubmit box {word}\n")]
    solution = [_click_target(box), {"type": "type", "text": word}, {"type": "key", "keys": ["enter"]}]
    return (f'Click the text box, type "{word}" and press Enter.', [box], validators, solution)


PANEL = (0.7, 0.7)                            # key-colour's square: half the screen, anywhere on it
KEYS = {"red": "r", "green": "g", "blue": "b", "yellow": "y"}


def _key_colour(rng: random.Random) -> tuple[str, list[Item], list[ValidatorSpec], list[dict]]:
    """One large square of one of four colours; the instruction is the same for every instance, so only the
    screenshot says which key to press. The square covers half the screen, so most image tokens carry the
    colour: a 2-layer model grounds it quickly, where a position on a 3x3 grid (click-square) took it
    hundreds of SFT steps, and a smaller square (30% x 42%) was still only half grounded after 300."""
    name = rng.choice(list(COLOURS))
    x, y = round(rng.uniform(0, 1 - PANEL[0]), 4), round(rng.uniform(0, 1 - PANEL[1]), 4)
    panel = Item("rect", "target", x, y, *PANEL, COLOURS[name])
    keys = Item("keys", "keys", 0, 0, 0, 0)      # the board records key presses for this instance
    legend = ", ".join(f"{key} for {colour}" for colour, key in KEYS.items())
    return (f"Press the key for the colour of the square: {legend}.", [panel, keys],
            [_events_equal(f"key {KEYS[name]}\n")], [{"type": "key", "keys": [KEYS[name]]}])


GREY = "#808080"                              # key-sequence: "press the previous key again"
SEQUENCE_STEPS = 3                            # key-sequence: decisions per episode
CONFUSED = ("yellow", "red")                  # key-sequence's biased demonstrator sees yellow as red
FLAIL = 12                                    # key presses a lost demonstrator makes (cut at max_turns)


def _key_sequence(rng: random.Random) -> tuple[str, list[Item], list[ValidatorSpec], list[dict]]:
    """Three key presses in a row, each shown by one screen, the reward only at the end (the multi-turn
    recipe's family, docs/learning.md). The board shows a large square; its colour's key moves the board on
    to the next square. One of the second and third squares is grey: press the previous key again, so the
    screen alone does not say which key (the history does). After the third right key the screen is empty
    and the agent should stop. Any wrong key loses the episode: the board shows a black screen from then on
    and never becomes empty, so a lost agent keeps pressing keys until its turn limit (failures run long,
    successes are short). The instance scores 1 only when the recorded keys are exactly the three right
    ones (nothing more: a key pressed after the end counts as wrong)."""
    names = [rng.choice(list(COLOURS)) for _ in range(SEQUENCE_STEPS - 1)]
    grey_at = rng.randint(1, SEQUENCE_STEPS - 1)
    colours = names[:grey_at] + [GREY] + names[grey_at:]
    keys: list[str] = []
    items = []
    for i, colour in enumerate(colours):
        key = keys[-1] if colour == GREY else KEYS[colour]
        keys.append(key)
        x, y = round(rng.uniform(0, 1 - PANEL[0]), 4), round(rng.uniform(0, 1 - PANEL[1]), 4)
        items.append(Item("step", f"step{i + 1}", x, y, *PANEL, colour if colour == GREY else COLOURS[colour], key))
    legend = ", ".join(f"{key} for {colour}" for colour, key in KEYS.items())
    instruction = (f"Press the key for the colour of each square as it appears ({legend}); for a grey square "
                   f"press the previous key again. Stop when the screen is empty.")
    events = "".join(f"key {key}\n" for key in keys)
    return instruction, items, [_events_equal(events)], [{"type": "key", "keys": [key]} for key in keys]


def _sequence_slips(instance: "Instance") -> list[tuple[dict, ...]]:
    """key-sequence's biased demonstrator: it presses red's key for the first yellow square, then, lost,
    keeps pressing keys (a seeded choice) until its turn limit. None when the instance shows no yellow."""
    seen, wrong = CONFUSED
    steps = [item for item in instance.items if item.kind == "step"]
    first = next((i for i, item in enumerate(steps) if item.colour == COLOURS[seen]), None)
    if first is None:
        return []
    rng = random.Random(f"flail:{instance.seed}")
    play = [*instance.solution[:first], {"type": "key", "keys": [KEYS[wrong]]}]
    play += [{"type": "key", "keys": [rng.choice(list(KEYS.values()))]} for _ in range(FLAIL)]
    return [tuple(play)]


def wrong_solutions(instance: "Instance") -> list[tuple[dict, ...]]:
    """Well-formed solutions of ``instance`` that fail: what an imperfect demonstrator plays instead
    (``sft.demo_error_rate``). Another key for key-colour, another cell's anchor for click-square, the
    yellow-as-red slip for key-sequence; none for the other families."""
    if instance.family == "key-sequence":
        return _sequence_slips(instance)
    if instance.family == "key-colour":
        right = instance.solution[0]["keys"][0]
        return [({"type": "key", "keys": [key]},) for key in KEYS.values() if key != right]
    if instance.family == "click-square":
        right = instance.solution[0]
        return [({"type": "click", "x": x, "y": y},) for x in ANCHORS for y in ANCHORS
                if (x, y) != (right["x"], right["y"])]
    return []


FAMILIES = {"click-square": _click_square, "click-colour": _click_colour, "type-word": _type_word,
            "key-colour": _key_colour, "key-sequence": _key_sequence}


def make_instance(family: str, seed: int) -> Instance:
    """The instance of ``family`` for ``seed``: the same pair always gives the same instance."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; known: {sorted(FAMILIES)}")
    rng = random.Random(f"{family}:{seed}")   # str seeds hash with SHA-512: stable across runs and platforms
    instruction, items, validators, solution = FAMILIES[family](rng)
    return Instance(family, seed, instruction, tuple(items), tuple(validators), tuple(solution))


# -- on a desktop -----------------------------------------------------------------------------------
def show(desktop, instance: Instance, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Hand ``instance`` to the board window of ``desktop`` and wait until it is drawn (blocking)."""
    folder = Path(desktop.home) / ".board"
    tmp = folder / "instance.tmp"
    tmp.write_text(instance.board_text())
    tmp.chmod(0o644)                          # the sandbox uid reads it (when the gym runs as root)
    tmp.rename(folder / "instance")           # atomic: the window never reads half a file
    deadline = time.monotonic() + timeout_s
    while not (folder / "ready").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the board window did not draw the instance within {timeout_s:.0f} s")
        time.sleep(0.01)
    desktop.screen.wait_stable(stable_s=0.05, timeout_s=2.0)
