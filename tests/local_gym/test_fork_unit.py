"""The pieces of a fork that need no desktop (fork.py, vm/layers.py, genv.Fork): the request's count, masks and
their 2 % limit, frame comparison outside a mask, a HOME's state (links and FIFOs never followed, settings files
compared by groups and keys), refcounted VM disk layers, and the client's parsing of a fork reply."""

from __future__ import annotations

import os

import pytest

from cua_rl.genv import Fork, GenvError
from cua_rl.local_gym import fork as F
from cua_rl.local_gym.tasks import TaskDef
from cua_rl.local_gym.vm import layers
from gym_helpers import nest_folders, remove_nested


def test_the_count_is_an_integer_in_range_and_nothing_else_is_accepted():
    assert F.fork_count({}) == 1 and F.fork_count({"count": 4}) == 4
    for bad in (None, {"count": 0}, {"count": F.MAX_COUNT + 1}, {"count": "2"}, {"count": True}, {"count": 2.0},
                {"count": 2, "depth": 1}, [2], "2"):
        with pytest.raises(ValueError):
            F.fork_count(bad)


def _task(**extra) -> dict:
    return {"number": "990", "name": "t", "category": "terminal", "difficulty": "easy", "instruction": "x",
            "setup": {"apps": [{"app": "xterm"}]}, "solution": [{"type": "key", "keys": ["a"]}],
            "validators": [{"id": "v", "type": "file_exists", "path": "a"}], **extra}


def test_a_task_declares_volatile_regions_within_two_percent_and_says_why_it_is_not_forkable():
    task = TaskDef.model_validate(_task(volatile=[[0.5, 0.02, 0.6, 0.06]]))
    assert task.forkable and task.to_wire()["forkable"] is True
    assert F.mask_pixels(task.volatile, 1280, 800) == [[640, 16, 768, 48]]
    assert F.mask_pixels([(0.1001, 0.2, 0.2, 0.30001)], 100, 100) == [[10, 20, 20, 31]]   # whole pixels, covering
    with pytest.raises(ValueError, match="at most 2%"):
        TaskDef.model_validate(_task(volatile=[[0, 0, 0.2, 0.2]]))
    with pytest.raises(ValueError, match="0 <= x0 < x1 <= 1"):
        TaskDef.model_validate(_task(volatile=[[0.5, 0, 0.4, 0.1]]))
    with pytest.raises(ValueError, match="fork_note"):
        TaskDef.model_validate(_task(forkable=False))
    off = TaskDef.model_validate(_task(forkable=False, fork_note="its clock"))
    assert off.to_wire()["forkable"] is False
    assert F.mask_share([(0, 0, 0.1, 0.1), (0.05, 0.05, 0.15, 0.15)]) == pytest.approx(0.0175)   # overlap once


def test_frames_compare_outside_the_mask_and_differences_are_located():
    w, h = 8, 4
    a = bytearray(w * h * 4)
    b = bytearray(a)
    b[(2 * w + 5) * 4] = 7                                   # the pixel (5, 2)
    assert not F.frames_equal(a, b, w, h, [])
    assert F.frames_equal(a, b, w, h, [[5, 2, 6, 3]])
    assert not F.frames_equal(a, b, w, h, [[0, 0, 5, 4]])
    assert F.difference(a, b, w, h, []) == "1 pixels differ, within [5, 2, 6, 3] (x0, y0, x1, y1)"
    assert F.screen_key(a, w, h, [[5, 2, 6, 3]]) == F.screen_key(b, w, h, [[5, 2, 6, 3]]) != F.screen_key(b, w, h, [])
    ppm = b"P6\n8 4\n255\n" + bytes(w * h * 3)                 # a VM's frame
    other = bytearray(ppm)
    other[-1] = 1
    assert F.difference(ppm, bytes(other), w, h, []).startswith("1 pixels differ, within [7, 3, 8, 4]")


def test_a_home_state_follows_nothing_and_compares_settings_files_by_their_keys(tmp_path):
    home = tmp_path / "home"
    (home / "d").mkdir(parents=True)
    (home / "d" / "f.txt").write_text("x")
    (tmp_path / "outside.txt").write_text("secret")
    os.symlink(tmp_path / "outside.txt", home / "link")
    os.mkfifo(home / "fifo", 0o600)                           # opening it for reading would block
    (home / ".cache").mkdir()
    (home / ".cache" / "thumb").write_text("changes")
    keyfile = home / F.KEY_FILES[0]
    keyfile.parent.mkdir(parents=True)
    keyfile.write_text("[b]\ny=2\nx=1\n\n[a]\nz=3\n")
    os.chmod(home / "d", 0o750)
    state = F.home_state(home)
    assert state["d"] == "dir 0750" and state["d/f.txt"].startswith("file ")
    assert state["link"] == f"link {tmp_path / 'outside.txt'}" and state["fifo"] == "other fifo 0600"
    assert not any(k.startswith(".cache") for k in state)
    keyfile.write_text("[a]\nz=3\n[b]\nx=1\ny=2\n")          # the same settings, written in another order
    assert F.home_state(home) == state
    keyfile.write_text("[a]\nz=4\n[b]\nx=1\ny=2\n")
    assert F.state_difference(state, F.home_state(home)).startswith(f"{F.KEY_FILES[0]}: differs at character")
    (home / "d" / "new").write_text("")
    assert F.state_difference(state, F.home_state(home)) is not None
    assert F.state_difference({"a": 1}, {"a": 1}) is None and "the child has none" in F.state_difference({"a": 1}, {})


def test_every_byte_of_a_home_is_compared_however_much_comes_before_it(tmp_path):
    """The attack (issue 80): 80 MB of zeros first, then a file each desktop fills at random. The state read
    64 MiB and took every file after that for equal, so a fork handed out a child with other contents."""
    homes = [tmp_path / "parent", tmp_path / "child"]
    for home, noise in zip(homes, (b"1f 2e", b"9a 0c")):
        home.mkdir()
        with open(home / "a.bin", "wb") as f:   # sparse: 80 MB of zeros that cost no disk
            f.truncate(80_000_000)
        (home / "noise.txt").write_bytes(noise)
    parent, child = (F.home_state(h) for h in homes)
    assert parent["a.bin"] == child["a.bin"] and " 80000000 bytes sha256 " in parent["a.bin"]
    assert F.state_difference(parent, child).startswith("noise.txt: differs"), (parent, child)
    os.chmod(homes[1] / "noise.txt", 0o600)            # same bytes, another mode: not the same state
    (homes[1] / "noise.txt").write_bytes(b"1f 2e")
    assert F.state_difference(parent, F.home_state(homes[1])).startswith("noise.txt: differs")


def test_a_home_the_state_cannot_compare_whole_is_refused_saying_why(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    with open(home / "big", "wb") as f:
        f.truncate(F.MAX_HOME_BYTES + 1)
    with pytest.raises(F.ForkRefused, match=r"HOME holds more than 256 MiB"):
        F.home_state(home)
    (home / "big").unlink()
    for i in range(12):
        (home / f"f{i}").write_text("")
    monkeypatch.setattr(F, "MAX_HOME_ENTRIES", 10)
    with pytest.raises(F.ForkRefused, match=r"HOME holds more than 10 files and folders"):
        F.home_state(home)


def test_a_home_a_thousand_folders_deep_is_refused_without_recursion_or_a_descriptor_per_level(tmp_path):
    """The attack (issue 80): a HOME 1,100 folders deep made every fork a 503 blaming the desktop (the recursive
    walk passed Python's recursion limit; a descriptor held per level can run out too)."""
    home = tmp_path / "home"
    home.mkdir()
    nest_folders(home, 1100)
    fds = len(os.listdir("/proc/self/fd"))
    try:
        with pytest.raises(F.ForkRefused, match=rf"HOME is more than {F.MAX_HOME_DEPTH} folders deep \(at 'd/d/d"):
            F.home_state(home)
        assert len(os.listdir("/proc/self/fd")) == fds, "the walk left descriptors open"
    finally:
        remove_nested(home)
    nest_folders(home, F.MAX_HOME_DEPTH)      # as deep as the bound allows: compared
    assert F.home_state(home)["/".join(["d"] * F.MAX_HOME_DEPTH)].startswith("dir ")


def test_a_disk_layer_lives_while_a_machine_or_a_layer_above_it_holds_it(tmp_path):
    """The VM fork's bookkeeping, as backend.VMDesktop.freeze and thaw hold and release layers."""
    parent_disk = tmp_path / "parent-overlay.qcow2"
    parent_disk.write_bytes(b"1")
    bottom = layers.hold(layers.freeze(parent_disk, tmp_path / "l1.qcow2", None), 2)   # the parent and the fork
    layers.hold(bottom)                          # a child resumed on it
    layers.release(bottom)                       # the fork is done
    layers.release(bottom)                       # the parent ended: its child still runs on the layer
    assert bottom.path.exists() and bottom.users == 1
    child_disk = tmp_path / "child-overlay.qcow2"
    child_disk.write_bytes(b"2")
    top = layers.hold(layers.freeze(child_disk, tmp_path / "l2.qcow2", bottom), 2)    # the child is forked in turn
    assert bottom.users == 1                     # the new layer took over the child's hold on the one below
    layers.release(top)                          # that fork is done
    assert top.path.exists() and bottom.path.exists()
    layers.release(top)                          # the child ended, the last holder: both layers go
    assert not top.path.exists() and not bottom.path.exists()
    assert child_disk.exists()                   # its own folder's link is the machine's to delete
    unused = layers.freeze(child_disk, tmp_path / "l3.qcow2", None)
    layers.discard(unused)
    assert not unused.path.exists() and child_disk.exists()


def test_the_client_reads_a_fork_reply_and_refuses_a_malformed_one():
    fork = Fork.from_raw({"executions": [{"id": "a", "execution_id": "a", "seed": 3}, {"id": "b"}],
                          "mask": [[1, 2, 3, 4]]})
    assert [e.execution_id for e in fork.executions] == ["a", "b"] and fork.executions[0].seed == 3
    assert fork.mask == ((1, 2, 3, 4),)
    for bad in ({}, {"executions": []}, {"executions": [{}]}, {"executions": [{"id": "a"}], "mask": [[1, 2, 3]]},
                {"executions": [{"id": "a"}], "mask": [[1, 2, 3, 4.5]]}):
        with pytest.raises(GenvError):
            Fork.from_raw(bad)
