"""The seeded curriculum (local_gym/curriculum.py) on real desktops through the HTTP API: every family's
scripted solution scores 1.0 on several seeds, the same executions untouched score below 1, a wrong click
scores below 1, the create reply carries the instance's instruction, the same seed draws the same screen
and different seeds draw different ones. Plus the pure parts: seeds, splits, instances."""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path

import pytest
from PIL import Image

from cua_rl.genv import GenvClient
from cua_rl.local_gym import load_tasks
from cua_rl.local_gym.curriculum import (
    ANCHORS,
    FAMILIES,
    HELDOUT_CONTENT_START,
    HELDOUT_START,
    make_instance,
    seeds,
    split_of,
    wrong_solutions,
)

FAMILY_TASKS = {"click-square": "050", "click-colour": "051", "type-word": "052", "key-colour": "053",
                "key-sequence": "054", "key-sequence-long": "055", "key-sequence-drill": "056"}
CLICK_FAMILIES = ("click-colour", "click-square", "type-word")
SEEDS = [0, 1, 2, HELDOUT_START + 3, HELDOUT_CONTENT_START + 4]   # training, held-out instance and content seeds
SLIP_SEED = 1                          # a key-sequence instance that shows yellow first (yellow, yellow, grey)


# -- pure -------------------------------------------------------------------------------------------
def test_every_family_has_a_task_and_instances_are_deterministic():
    tasks = load_tasks()
    assert {tasks.get(n).family for n in FAMILY_TASKS.values()} == set(FAMILIES)
    for family in FAMILIES:
        a, b = make_instance(family, 5), make_instance(family, 5)
        assert a == b
        others = {make_instance(family, s).board_text() for s in range(6)}
        assert len(others) == 6, family   # the jitter alone moves the target every time


def test_seed_splits_are_disjoint_and_fixed():
    train, held, content = seeds("train", 50), seeds("heldout", 50), seeds("heldout-content", 50)
    assert not set(train) & set(held) and not set(held) & set(content) and not set(train) & set(content)
    assert {split_of(s) for s in train} == {"train"} and {split_of(s) for s in held} == {"heldout"}
    assert {split_of(s) for s in content} == {"heldout-content"}
    assert seeds("heldout", 3, offset=10) == [HELDOUT_START + 10 + i for i in range(3)]
    assert split_of(2 ** 31 - 1) == "train"   # every seed the workflow derives (31 bits) is a training seed
    with pytest.raises(ValueError):
        seeds("test", 1)


def test_click_square_target_moves_and_stays_inside_the_screen():
    centres = {make_instance("click-square", s).items[0].centre for s in range(40)}
    assert len(centres) == 40
    for s in range(40):
        (item,) = make_instance("click-square", s).items
        assert 0 <= item.x and item.x + item.w <= 1 and 0 <= item.y and item.y + item.h <= 1


@pytest.mark.parametrize("family", CLICK_FAMILIES)
def test_scripted_clicks_land_on_the_target_at_a_cell_anchor(family):
    """The solution clicks the anchor of the target's cell: inside the target for every jitter, and one of
    GRID x GRID points (what SFT demonstrates)."""
    points = set()
    for seed in [*range(500), *seeds("heldout", 500)]:
        instance = make_instance(family, seed)
        target = next(i for i in instance.items if i.id in ("target", "box"))
        for action in (a for a in instance.solution if a["type"] == "click"):
            assert action["x"] in ANCHORS and action["y"] in ANCHORS
            assert target.x < action["x"] < target.x + target.w and target.y < action["y"] < target.y + target.h
            points.add((action["x"], action["y"]))
    assert len(points) == len(ANCHORS) ** 2
    digits = "".join(str(round(a * 1000)) for a in ANCHORS)
    assert len(set(digits)) == len(digits)     # no digit repeats across the anchors (see ANCHORS)


# -- on desktops ------------------------------------------------------------------------------------
async def _play(client: GenvClient, task: str, seed: int, actions) -> tuple[dict, float, float]:
    async with client.execution(task, {"seed": seed}) as ex:
        before = (await client.evaluate(ex.execution_id)).reward
        for action in actions:
            assert (await client.act(ex.execution_id, action))["ok"], action
        after = (await client.evaluate(ex.execution_id)).reward
        return ex.raw, before, after


@pytest.mark.desktop
async def test_scripted_solutions_score_one_and_untouched_or_wrong_do_not(gym):
    async with GenvClient(gym.url, gym.gym_id) as client:
        jobs = [(f, s) for f in FAMILIES for s in SEEDS]
        sem = asyncio.Semaphore(4)

        async def one(family, seed):
            async with sem:
                return await _play(client, FAMILY_TASKS[family], seed, make_instance(family, seed).solution)
        results = await asyncio.gather(*(one(f, s) for f, s in jobs))
        for (family, seed), (reply, before, after) in zip(jobs, results):
            instance = make_instance(family, seed)
            assert reply["instruction"] == instance.instruction and reply["seed"] == seed
            assert reply["instance"] == {"family": family, "seed": seed, "split": split_of(seed)}
            assert before == 0.0 and after == 1.0, (family, seed, before, after)
        # a click on the empty corner opposite to the target misses
        target = make_instance("click-square", 0).solution[0]
        miss = {"type": "click", "x": 0.02 if target["x"] > 0.5 else 0.98, "y": 0.02 if target["y"] > 0.5 else 0.98}
        _, _, after = await _play(client, "050", 0, [miss])
        assert after == 0.0
        # the right colour matters: clicking another square scores 0
        inst = make_instance("click-colour", 1)
        other = next(i for i in inst.items if i.id != "target")
        x, y = other.centre
        _, _, after = await _play(client, "051", 1, [{"type": "click", "x": x, "y": y}])
        assert after == 0.0
        # key-colour: every wrong key scores 0, and so does the right key pressed twice
        inst = make_instance("key-colour", 2)
        for wrong in wrong_solutions(inst):
            _, _, after = await _play(client, "053", 2, wrong)
            assert after == 0.0, wrong
        _, _, after = await _play(client, "053", 2, inst.solution * 2)
        assert after == 0.0
        # key-sequence: the biased demonstrator's slip scores 0, and so does a key after the last step
        inst = make_instance("key-sequence", SLIP_SEED)
        (slip,) = wrong_solutions(inst)
        _, _, after = await _play(client, "054", SLIP_SEED, slip)
        assert after == 0.0
        _, _, after = await _play(client, "054", SLIP_SEED, inst.solution + inst.solution[:1])
        assert after == 0.0
    assert gym.manager.executions == {}


async def _screen(client: GenvClient, task: str, seed: int | None) -> tuple[bytes, dict]:
    async with client.execution(task, {"seed": seed} if seed is not None else None) as ex:
        return await client.screenshot(ex.execution_id), ex.raw


@pytest.mark.desktop
async def test_same_seed_same_screen_other_seed_other_screen(gym):
    async with GenvClient(gym.url, gym.gym_id) as client:
        a, b, c = [await _screen(client, "051", s) for s in (7, 7, 8)]
        pixels = [Image.open(io.BytesIO(shot)).convert("RGB").tobytes() for shot, _ in (a, b, c)]
        assert pixels[0] == pixels[1] and pixels[0] != pixels[2]
        assert a[1]["instruction"] == b[1]["instruction"]
        # no seed: a random training seed, returned so the instance can be replayed
        _, raw = await _screen(client, "050", None)
        assert split_of(raw["seed"]) == "train"
        assert raw["instruction"] == make_instance("click-square", raw["seed"]).instruction


def test_key_colour_needs_the_screenshot_and_wrong_solutions_are_wrong():
    """One instruction for every instance: the colour (and so the key) is only on the screen; every colour
    occurs; an imperfect demonstrator's alternatives are the other keys (click-square: the other 8 cells)."""
    instances = [make_instance("key-colour", s) for s in range(200)]
    assert len({i.instruction for i in instances}) == 1
    keys = {i.solution[0]["keys"][0] for i in instances}
    assert keys == {"r", "g", "b", "y"}
    for inst in instances[:20]:
        panel = inst.items[0]
        assert 0 <= panel.x and panel.x + panel.w <= 1 and 0 <= panel.y and panel.y + panel.h <= 1
        wrong = wrong_solutions(inst)
        assert len(wrong) == 3 and inst.solution not in wrong
    square = make_instance("click-square", 3)
    assert len(wrong_solutions(square)) == 8 and square.solution not in wrong_solutions(square)
    assert wrong_solutions(make_instance("type-word", 3)) == []


def test_key_sequence_is_three_decisions_with_one_remembered_and_known_biased_slices():
    """Three keys per instance, one per screen; one of the second and third screens is grey and asks for the
    previous key (only the history says which); the biased demonstrator slips exactly on the instances that
    show the confused colour (yellow seen as red), pressing the other colour's key at the first
    of them after the right prefix, and stopping there (the black screen that follows)."""
    from cua_rl.local_gym.curriculum import CONFUSIONS, GREY, SEQUENCE_COLOURS, SEQUENCE_KEYS, slices

    instances = [make_instance("key-sequence", s) for s in range(600)]
    assert len({i.instruction for i in instances}) == 1
    grey_at, shown = set(), set()
    for inst in instances:
        steps = [item for item in inst.items if item.kind == "step"]
        keys = [a["keys"][0] for a in inst.solution]
        assert len(steps) == len(keys) == 3 and [s.key for s in steps] == keys
        (g,) = [i for i, s in enumerate(steps) if s.colour == GREY]
        grey_at.add(g)
        assert g > 0 and keys[g] == keys[g - 1]
        assert inst.validators[0].text == "".join(f"key {k}\n" for k in keys)
        assert [s.colour for s in steps] == [GREY if c == "grey" else SEQUENCE_COLOURS[c]
                                            for c in inst.content.split("-")]
        shown |= {s.colour for s in steps}
        confused = [i for i, s in enumerate(steps) if s.colour in {SEQUENCE_COLOURS[c] for c in CONFUSIONS}]
        slips = wrong_solutions(inst)
        assert bool(slips) == bool(confused) == (slices(inst) != ("rest",))
        if slips:
            (slip,) = slips
            first = confused[0]
            seen = next(c for c in CONFUSIONS if SEQUENCE_COLOURS[c] == steps[first].colour)
            assert slip[:first] == inst.solution[:first] and slip[first]["keys"] == [SEQUENCE_KEYS[CONFUSIONS[seen]]]
            assert len(slip) == first + 1              # it stops at the black screen: no keys after the slip
    assert grey_at == {1, 2} and shown == {*SEQUENCE_COLOURS.values(), GREY}
    share = {name: sum(name in slices(i) for i in instances) / len(instances) for name in (*CONFUSIONS, "rest")}
    assert 0.25 < share["yellow"] < 0.4 and 0.6 < share["rest"] < 0.75, share
    assert make_instance("key-sequence", SLIP_SEED).items[0].colour == SEQUENCE_COLOURS["yellow"]


def test_the_yardsticks_splits_are_disjoint_by_content():
    """Held out by content, not only by seed: no key sequence that a training seed (every SFT demonstration's and
    every seed the workflow derives for a group: 31 bits) or a held-out-instance seed can draw is ever drawn by a
    held-out-content seed, and each gated regime holds at least 30 content units."""
    from cua_rl.local_gym.curriculum import HELDOUT_SEQUENCES, TRAIN_SEQUENCES, regimes, sequences
    from cua_rl.workflow.seeding import instance_seed

    assert not set(TRAIN_SEQUENCES) & set(HELDOUT_SEQUENCES)
    assert set(TRAIN_SEQUENCES) | set(HELDOUT_SEQUENCES) == set(sequences(3))
    trained = {make_instance("key-sequence", s).content for s in seeds("train", 2000)}
    derived = {make_instance("key-sequence", instance_seed(1, "stream", "054", 0, i)).content for i in range(2000)}
    instances = {make_instance("key-sequence", s).content for s in seeds("heldout", 2000)}
    content = {make_instance("key-sequence", s).content for s in seeds("heldout-content", 2000)}
    assert trained == derived == instances == {"-".join(q) for q in TRAIN_SEQUENCES}
    assert content == {"-".join(q) for q in HELDOUT_SEQUENCES}
    assert not (trained | derived) & content
    gated = [r for r in regimes("key-sequence") if r.gated]
    assert [r.name for r in gated] == ["instances", "content"]
    assert len(TRAIN_SEQUENCES) >= 30 and len(HELDOUT_SEQUENCES) >= 30
    # every single decision of a held-out sequence is trained: each colour at each position, both grey positions
    for position in range(3):
        assert {q[position] for q in HELDOUT_SEQUENCES} <= {q[position] for q in TRAIN_SEQUENCES}
    # the unseen family is never trained: no recipe's SFT or task source names its task (055)
    (family,) = [r for r in regimes("key-sequence") if not r.gated]
    assert family.family == "key-sequence-long" and FAMILY_TASKS[family.family] == "055"
    recipes = Path(__file__).resolve().parents[2] / "cua_rl" / "recipes"
    assert [f.name for f in recipes.glob("config*.yaml") if "055" in f.read_text()] == []


def test_the_drill_trains_on_the_confused_sequences_more_often_and_is_judged_on_key_sequence():
    """key-sequence-drill (the multi-turn recipe's training task since the fourth task change): its training
    seeds, SFT's and the workflow's, draw only trained sequences and show yellow about three times in four
    (key-sequence: about 11 in 36); its held-out seeds draw from key-sequence's pools and its regimes are
    key-sequence's, played on task 054."""
    from cua_rl.local_gym.curriculum import DRILL_SHARE, HELDOUT_SEQUENCES, TRAIN_SEQUENCES, regimes, slices
    from cua_rl.workflow.seeding import instance_seed

    trained = [make_instance("key-sequence-drill", s) for s in seeds("train", 1000)]
    trained += [make_instance("key-sequence-drill", instance_seed(1, "stream", "056", 0, i)) for i in range(1000)]
    assert {i.content for i in trained} == {"-".join(q) for q in TRAIN_SEQUENCES}
    share = sum(slices(i) == ("yellow",) for i in trained) / len(trained)
    plain = sum(slices(make_instance("key-sequence", s)) == ("yellow",) for s in seeds("train", 2000)) / 2000
    assert abs(share - DRILL_SHARE) < 0.04 and abs(plain - 11 / 36) < 0.04
    content = {make_instance("key-sequence-drill", s).content for s in seeds("heldout-content", 500)}
    assert content == {"-".join(q) for q in HELDOUT_SEQUENCES}
    assert regimes("key-sequence-drill") == regimes("key-sequence")
    assert {r.family for r in regimes("key-sequence-drill") if r.gated} == {"key-sequence"}


@pytest.mark.desktop
async def test_key_sequence_screens_follow_the_keys(gym):
    """Each right key shows the next step's square, the last one an empty (white) screen; a wrong key turns
    the screen black for good."""
    def centre(shot: bytes) -> tuple:
        image = Image.open(io.BytesIO(shot)).convert("RGB")
        return image.getpixel((image.width // 2, image.height // 2))

    inst = make_instance("key-sequence", 0)     # red, grey, green: each square covers the screen's centre
    async with GenvClient(gym.url, gym.gym_id) as client:
        async with client.execution("054", {"seed": 0}) as ex:
            seen = [centre(await client.screenshot(ex.execution_id))]
            for action in inst.solution:
                assert (await client.act(ex.execution_id, action))["ok"]
                seen.append(centre(await client.screenshot(ex.execution_id)))
        assert [max(abs(a - b) for a, b in zip(px, want)) < 40 for px, want in
                zip(seen, [(224, 32, 32), (128, 128, 128), (32, 160, 32), (255, 255, 255)])] == [True] * 4, seen
        async with client.execution("054", {"seed": 0}) as ex:
            for key in ("g", "r"):                 # wrong, then the right one: still lost
                assert (await client.act(ex.execution_id, {"type": "key", "keys": [key]}))["ok"]
            assert centre(await client.screenshot(ex.execution_id)) == (0, 0, 0)


@pytest.mark.desktop
def test_a_board_the_window_manager_never_managed_is_refused_not_shown_in_a_corner(tmp_path):
    """Seen in a tree run on cold desktops under load (2026-11-30): openbox never managed the board's window, so
    Tk's 200x200 window sat in the top-left corner of a black screen, and the policy looked at that for the whole
    episode (three invalid replies, a failure trained as the policy's). Reproduced for real: the board on an Xvfb
    with no window manager. ``show`` must refuse it (the create becomes the gym's 503); the next test shows a
    managed board on the gym's desktops reporting the whole screen."""
    import shutil
    import subprocess
    from types import SimpleNamespace

    from cua_rl.local_gym import curriculum
    from gym_helpers import bare_x

    (tmp_path / ".board").mkdir()
    shutil.copy(Path(curriculum.__file__).parent / "board.tcl", tmp_path / ".board" / "board.tcl")
    with bare_x(1280, 800) as display:
        board = subprocess.Popen(["wish", str(tmp_path / ".board" / "board.tcl")],
                                 env={**os.environ, "DISPLAY": display, "HOME": str(tmp_path)})
        try:
            with pytest.raises(RuntimeError, match=r"the board window is 200x200 on a 1280x800 screen: the window "
                                                   r"manager did not maximise it"):
                curriculum.show(SimpleNamespace(home=str(tmp_path)), make_instance("key-sequence", 3))
        finally:
            board.kill()
            board.wait()


@pytest.mark.desktop
async def test_a_shown_board_covers_the_screen(gym):
    async with GenvClient(gym.url, gym.gym_id) as client:
        async with client.execution("054", {"seed": 3}) as ex:
            home = Path(gym.manager.executions[ex.execution_id].desktop.home)
            ok, width, height, screen_w, screen_h = (home / ".board" / "ready").read_text().split()
            assert ok == "ok" and (screen_w, screen_h) == ("1280", "800"), (width, height)
            assert int(width) > 1200 and int(height) > 700, "a managed board is maximised (less its borders)"
