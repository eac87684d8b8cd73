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

Seeds split three ways: train (``0 .. HELDOUT_START-1``), held-out instances (``HELDOUT_START ..
HELDOUT_CONTENT_START-1``) and held-out content (``HELDOUT_CONTENT_START ..``). Every seed the workflow derives
for a training group (31 bits) and every SFT demonstration's seed is a training seed; evaluation plays held-out
seeds, always through ``heldout_seeds`` (the one function the in-training evaluator, ``cua_rl.workflow.seeding``,
and ``cua_rl.evaluate`` read, so a change of the held-out sets is made here once). A family whose content space is large
enough to hold part of it out (key-sequence: which key sequence an instance asks for) draws a training or
held-out-instance seed's content from its training content only, and a held-out-content seed's from the rest,
so nothing trained on ever shows held-out content (``Instance.content`` names an instance's content unit). For
the other families both held-out splits are unseen instances of the same content.

``regimes(family)``: where the learning yardstick measures a family's held-out success (docs/learning.md):
unseen instances of trained content, unseen content of the trained family, and an unseen family that needs
the same skills; the first two are gated.
"""

from __future__ import annotations

import itertools
import random
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from .validators import ValidatorSpec

HELDOUT_START = 2 ** 40                       # held-out instances (of trained content)
HELDOUT_CONTENT_START = 2 ** 41               # held-out content (for families that hold content out)
# The seeds our gyms take (0..2**53-1: JSON numbers are exact up to here), declared in every task object they
# list (``seed_bits``, docs/protocols.md 1.2), so the workflow sends them these held-out seeds (workflow/seeding.py)
SEED_BITS = 53
SPLITS = ("train", "heldout", "heldout-content")
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
    content: str = ""         # the content unit: what an instance asks for, apart from where things are drawn

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
    return "heldout-content" if seed >= HELDOUT_CONTENT_START else "heldout" if seed >= HELDOUT_START else "train"


def seeds(split: str, n: int, offset: int = 0) -> list[int]:
    """``n`` seeds of ``split`` (one of ``SPLITS``), starting ``offset`` into it: fixed lists, so two runs
    evaluate on the same instances."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    base = {"train": 0, "heldout": HELDOUT_START, "heldout-content": HELDOUT_CONTENT_START}[split]
    return [base + offset + i for i in range(n)]


def heldout_seeds(n: int, offset: int = 0, split: str = "heldout") -> list[int]:
    """The held-out seeds every evaluation plays: the first ``n`` (from ``offset``) of ``split`` ("heldout":
    unseen instances, the yardstick's first regime and what the in-training evaluator plays; "heldout-content":
    unseen content). The one function the in-training evaluator (``cua_rl.workflow.seeding``) and
    ``cua_rl.evaluate`` read, so a change of the held-out sets is made in this one place."""
    if split == "train":
        raise ValueError("heldout_seeds: 'train' is no held-out split")
    return seeds(split, n, offset)


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


Family = tuple[str, list[Item], list[ValidatorSpec], list[dict], str]   # instruction, items, validators,
# solution, content unit


def _click_square(rng: random.Random, split: str) -> Family:
    """One red square somewhere on a 3x3 grid: only the screenshot says where."""
    (cell,) = _cells(rng, 1)
    target = Item("rect", "target", *_place(rng, cell, SQUARE), *SQUARE, COLOURS["red"])
    return ("Click the red square.", [target], [_events_equal("click target\n")], [_click_target(target)],
            f"cell-{cell[0]}{cell[1]}")


def _click_colour(rng: random.Random, split: str) -> Family:
    """Four squares of different colours; the instruction names one: text and screenshot are both needed."""
    names = list(COLOURS)
    want = rng.choice(names)
    items = []
    for name, cell in zip(names, _cells(rng, len(names))):
        item_id = "target" if name == want else f"other-{name}"
        items.append(Item("rect", item_id, *_place(rng, cell, SQUARE), *SQUARE, COLOURS[name]))
    target = next(i for i in items if i.id == "target")
    return (f"Click the {want} square.", items, [_events_equal("click target\n")], [_click_target(target)], want)


def _type_word(rng: random.Random, split: str) -> Family:
    """A text box somewhere on the grid: click it, type the word, press Enter (3 actions)."""
    word = rng.choice(WORDS)
    (cell,) = _cells(rng, 1)
    box = Item("entry", "box", *_place(rng, cell, BOX), *BOX)
    validators = [ValidatorSpec(id="submitted", type="file_matches", path=EVENTS, pattern=f"^submit box {word}$"),
                  _events_equal(f"click box\nsubmit box {word}\n")]
    solution = [_click_target(box), {"type": "type", "text": word}, {"type": "key", "keys": ["enter"]}]
    return (f'Click the text box, type "{word}" and press Enter.', [box], validators, solution, word)


PANEL = (0.7, 0.7)                            # key-colour's square: half the screen, anywhere on it
KEYS = {"red": "r", "green": "g", "blue": "b", "yellow": "y"}


def _key_colour(rng: random.Random, split: str) -> Family:
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
            [_events_equal(f"key {KEYS[name]}\n")], [{"type": "key", "keys": [KEYS[name]]}], name)


# -- key sequences: the learning yardstick's families ------------------------------------------------
GREY = "#808080"                              # "press the previous key again"
# The sequence families' six colours and their keys (four of key-colour's and two more, far apart in RGB)
SEQUENCE_COLOURS = {**COLOURS, "magenta": "#c020c0", "cyan": "#20b0c0"}
SEQUENCE_KEYS = {**KEYS, "magenta": "m", "cyan": "c"}
# The biased demonstrator confuses yellow with red (seen -> pressed): the slice where the warm start is wrong,
# which a run must flip to pass the learning gate (docs/learning.md, "The yardstick"). A second confusion, cyan
# seen as blue, was dropped on 2026-11-29: its warm start never pressed c on cyan (0 of 40 sampled episodes,
# against 7 of 88 on yellow from the same share of slipped demonstrations), so no run could learn the flip and
# CI's gate failed on it (cyan 0.0 -> 0.0 while yellow rose 0.0 -> 0.48).
CONFUSIONS = {"yellow": "red"}


def sequences(length: int) -> list[tuple[str, ...]]:
    """Every colour sequence of ``length`` squares with exactly one grey square, never the first: the content
    units of a sequence family (key-sequence: 6 x 6 x 2 = 72; key-sequence-long: 6^3 x 3 = 648)."""
    out = []
    for grey_at in range(1, length):
        for draws in itertools.product(SEQUENCE_COLOURS, repeat=length - 1):
            out.append((*draws[:grey_at], "grey", *draws[grey_at:]))
    return out


def heldout_content(sequence: tuple[str, ...]) -> bool:
    """Whether key-sequence holds ``sequence`` out of training (half of the 72): by the parity of its colours'
    indices plus the grey square's position, so every colour at every position, both grey positions and both
    confusions still occur among the trained sequences (each single decision is trained; the held-out ones are
    new combinations of them)."""
    index = list(SEQUENCE_COLOURS)
    return (sum(index.index(c) for c in sequence if c != "grey") + sequence.index("grey")) % 2 == 1


SHORT = sequences(3)
TRAIN_SEQUENCES = [q for q in SHORT if not heldout_content(q)]
HELDOUT_SEQUENCES = [q for q in SHORT if heldout_content(q)]


def _sequence_instance(rng: random.Random, sequence: tuple[str, ...]) -> Family:
    """The board of one colour sequence: a large square per step; its colour's key moves the board on to the
    next square (grey: the previous key again, so the screen alone does not say which key: the history does).
    After the last right key the screen is empty and the agent should stop. Any wrong key loses the episode:
    the board shows a black screen from then on, and the agent should stop there too (the instruction says so;
    a key pressed after it changes nothing). The instance scores 1 only when the recorded keys are exactly the
    right ones (nothing more: a key pressed after the end counts as wrong)."""
    keys: list[str] = []
    items = []
    for i, colour in enumerate(sequence):
        key = keys[-1] if colour == "grey" else SEQUENCE_KEYS[colour]
        keys.append(key)
        x, y = round(rng.uniform(0, 1 - PANEL[0]), 4), round(rng.uniform(0, 1 - PANEL[1]), 4)
        shade = GREY if colour == "grey" else SEQUENCE_COLOURS[colour]
        items.append(Item("step", f"step{i + 1}", x, y, *PANEL, shade, key))
    legend = ", ".join(f"{key} for {colour}" for colour, key in SEQUENCE_KEYS.items())
    instruction = (f"Press the key for the colour of each square as it appears ({legend}); for a grey square "
                   f"press the previous key again. Stop when the screen is empty, or black (a wrong key: the episode is "
                   f"lost).")
    events = "".join(f"key {key}\n" for key in keys)
    return (instruction, items, [_events_equal(events)], [{"type": "key", "keys": [key]} for key in keys],
            "-".join(sequence))


def _key_sequence(rng: random.Random, split: str) -> Family:
    """Three key presses in a row, each shown by one screen, the reward only at the end (the multi-turn
    recipe's family and the learning yardstick's, docs/learning.md): one of the 72 sequences of three squares
    (two of six colours and a grey second or third square); a training or held-out-instance seed draws one of
    the 36 trained sequences, a held-out-content seed one of the other 36 (``heldout_content``)."""
    pool = HELDOUT_SEQUENCES if split == "heldout-content" else TRAIN_SEQUENCES
    return _sequence_instance(rng, rng.choice(pool))


# key-sequence-drill's training draws: this share of its groups shows a confused colour (key-sequence draws one
# in about 11 of 36). The learning yardstick's fourth task (docs/learning.md): a run sees about 2.4 times as many
# groups where the warm start's wrong choice can be corrected, so GRPO's drift on it is a sum of many small
# updates while a shuffled-reward control's walk, whose updates have random signs, grows only with their root.
DRILL_SHARE = 0.75
CONFUSED_TRAIN = [q for q in TRAIN_SEQUENCES if set(q) & set(CONFUSIONS)]
CLEAR_TRAIN = [q for q in TRAIN_SEQUENCES if not set(q) & set(CONFUSIONS)]


def _key_sequence_drill(rng: random.Random, split: str) -> Family:
    """key-sequence's 36 trained sequences with the confused ones drawn more often in training: a training seed
    shows a confused colour with probability ``DRILL_SHARE`` (a uniform choice among those sequences, else
    among the others). Its held-out seeds draw as key-sequence's do, and its regimes are key-sequence's (played
    on that task: the same held-out instances whichever of the two a run trains on); SFT demonstrates
    key-sequence itself, so the warm start does not change."""
    if split != "train":
        return _key_sequence(rng, split)
    return _sequence_instance(rng, rng.choice(CONFUSED_TRAIN if rng.random() < DRILL_SHARE else CLEAR_TRAIN))


def _key_sequence_long(rng: random.Random, split: str) -> Family:
    """Four key presses (three colours and a grey square second, third or fourth): the yardstick's unseen
    family, never trained, that needs the same skills as key-sequence (each colour's key, the previous key
    again for grey) over one more screen."""
    return _sequence_instance(rng, rng.choice(sequences(4)))


def _sequence_slips(instance: "Instance") -> list[tuple[dict, ...]]:
    """The sequence families' biased demonstrator: at the first square of a confused colour (``CONFUSIONS``) it
    presses the colour it sees instead's key, and stops at the black screen that follows (the demonstration
    ends with ``terminate``, as a successful one does at the empty screen). None when the instance shows no
    confused colour.

    Until 2026-11-29 (second change) the lost demonstrator kept pressing seeded random keys up to its turn limit,
    so every failed episode of a run carried 3-5 key presses of a near-uniform choice (each with about 16 times
    the gradient of a confident decision) whose only credit is the episode's reward: the largest share of what a
    shuffled-reward control's updates move the key logits with, and 2 of 8 such controls flipped the yellow
    choice as GRPO does (docs/notes/learning-history.md, "The gate's false-pass rate and power")."""
    shades = {SEQUENCE_COLOURS[seen]: pressed for seen, pressed in CONFUSIONS.items()}
    steps = [item for item in instance.items if item.kind == "step"]
    first = next((i for i, item in enumerate(steps) if item.colour in shades), None)
    if first is None:
        return []
    return [(*instance.solution[:first], {"type": "key", "keys": [SEQUENCE_KEYS[shades[steps[first].colour]]]})]


def wrong_solutions(instance: "Instance") -> list[tuple[dict, ...]]:
    """Well-formed solutions of ``instance`` that fail: what an imperfect demonstrator plays instead
    (``sft.demo_error_rate``). Another key for key-colour, another cell's anchor for click-square, the
    confusion slip for the sequence families; none for the other families."""
    if instance.family in SEQUENCE_FAMILIES:
        return _sequence_slips(instance)
    if instance.family == "key-colour":
        right = instance.solution[0]["keys"][0]
        return [({"type": "key", "keys": [key]},) for key in KEYS.values() if key != right]
    if instance.family == "click-square":
        right = instance.solution[0]
        return [({"type": "click", "x": x, "y": y},) for x in ANCHORS for y in ANCHORS
                if (x, y) != (right["x"], right["y"])]
    return []


def slices(instance: "Instance") -> tuple[str, ...]:
    """The evaluation slices ``instance`` belongs to: for the sequence families each confused colour it shows
    (where the biased warm start is wrong), else ``rest``; for the others ``slip`` (the demonstrator has a wrong
    solution for it) or ``clean``."""
    if instance.family in SEQUENCE_FAMILIES:
        shown = set(instance.content.split("-"))
        return tuple(seen for seen in CONFUSIONS if seen in shown) or ("rest",)
    return ("slip",) if wrong_solutions(instance) else ("clean",)


FAMILIES = {"click-square": _click_square, "click-colour": _click_colour, "type-word": _type_word,
            "key-colour": _key_colour, "key-sequence": _key_sequence, "key-sequence-long": _key_sequence_long,
            "key-sequence-drill": _key_sequence_drill}
SEQUENCE_FAMILIES = ("key-sequence", "key-sequence-long", "key-sequence-drill")


@dataclass(frozen=True)
class Regime:
    """One held-out regime of the learning yardstick: instances of ``family`` at seeds of ``split``."""

    name: str
    family: str
    split: str
    gated: bool               # the learning gate judges it (else reported only)
    what: str


REGIMES = {
    "key-sequence": (
        Regime("instances", "key-sequence", "heldout", True, "unseen instances of the trained key sequences"),
        Regime("content", "key-sequence", "heldout-content", True,
               "unseen key sequences of the trained family (new combinations of trained decisions)"),
        Regime("family", "key-sequence-long", "heldout", False,
               "an unseen family that needs the same skills (four squares, never trained)"),
    ),
}
REGIMES["key-sequence-drill"] = REGIMES["key-sequence"]   # the same sequences, drawn otherwise in training


# The yardstick's gated regimes: what the learning gate (bench/learning_bench.py) and a run's verdict
# (cua_rl/verdict.py) judge; a family has both only when it has held-out content (key-sequence).
GATED = ("instances", "content")


def regimes(family: str) -> tuple[Regime, ...]:
    """Where the yardstick measures ``family``'s held-out success; a family without content regimes has one:
    its unseen instances."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; known: {sorted(FAMILIES)}")
    return REGIMES.get(family, (Regime("instances", family, "heldout", True, f"unseen instances of {family}"),))


def make_instance(family: str, seed: int) -> Instance:
    """The instance of ``family`` for ``seed``: the same pair always gives the same instance."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; known: {sorted(FAMILIES)}")
    rng = random.Random(f"{family}:{seed}")   # str seeds hash with SHA-512: stable across runs and platforms
    instruction, items, validators, solution, content = FAMILIES[family](rng, split_of(seed))
    return Instance(family, seed, instruction, tuple(items), tuple(validators), tuple(solution), content)


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
    _check_maximised((folder / "ready").read_text())
    desktop.screen.wait_stable(stable_s=0.05, timeout_s=2.0)


def _check_maximised(ready: str) -> None:
    """The board drew itself at the size its window had: a window the window manager never managed keeps Tk's
    200x200 in the corner of a black screen (seen on cold desktops under load: the policy then looks at that
    screen for the whole episode and fails through no fault of its own). Such a start is the gym's failure."""
    fields = ready.split()
    if len(fields) != 5 or fields[0] != "ok":
        raise RuntimeError(f"the board window wrote {ready.strip()!r} when ready, not 'ok W H SW SH'")
    w, h, sw, sh = (int(x) for x in fields[1:])
    if w < sw // 2 or h < sh // 2:
        raise RuntimeError(f"the board window is {w}x{h} on a {sw}x{sh} screen: the window manager did not "
                           "maximise it (the task would show in a corner of a black screen)")
