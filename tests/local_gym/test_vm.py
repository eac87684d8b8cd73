"""The VM foundation on real QEMU (KVM where the machine has it, else TCG): a copy-on-write overlay that
leaves the base image untouched, QMP screenshots and input, and no QEMU process, overlay or socket left after
stop, a bad image or a SIGKILLed owner. No guest OS is needed: a machine without a bootable disk shows its
firmware's text screen, which is a real screen to capture.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from cua_rl.local_gym import procs
from cua_rl.local_gym.vm.machine import Machine, VMSpec, wait_for_screen
from tests.hosts import wait_gone


@pytest.fixture
def spawner():
    sp = procs.Spawner(1)
    yield sp
    sp.close()


def _base(tmp_path: Path) -> Path:
    base = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "16M"], check=True)
    return base


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _colours(png: bytes) -> int:
    return len(Image.open(io.BytesIO(png)).convert("RGB").getcolors(1 << 20) or [])


def test_overlay_takes_the_writes_screen_and_input_work_and_stop_removes_everything(tmp_path, spawner):
    base = _base(tmp_path)
    before = _digest(base)
    vm = spawner.submit(Machine.start, VMSpec(base_image=str(base), memory_mib=128), workdir=tmp_path).result()
    root, pid = vm.root, vm.proc.pid
    try:
        assert vm.accel in ("kvm", "tcg") and vm.status() == "running"
        overlay_size = vm.overlay.stat().st_size
        # a write through the VM's disk (QEMU's own block layer, as a guest's would be) lands in the overlay
        vm.qmp.hmp('qemu-io virtio0 "write -P 0xab 0 1M"')   # qemu-io reports on QEMU's own output
        assert procs.wait_until(lambda: "wrote 1048576" in (root / "qemu.log").read_text(), 5.0)
        assert vm.overlay.stat().st_size >= overlay_size + (1 << 20)
        # the firmware's text screen: "No bootable device" once it has tried the disk
        png = wait_for_screen(vm, lambda p: _colours(p) > 1, timeout_s=30)
        assert png is not None and Image.open(io.BytesIO(png)).size[0] >= 640
        vm.key("ctrl", "alt", "delete")
        vm.click(0.5, 0.5)
        assert vm.status() == "running"
    finally:
        spawner.submit(vm.stop).result()
    assert wait_gone({pid}) == set()
    assert not root.exists()
    assert _digest(base) == before, "the base image was written"


def test_a_bad_base_image_is_a_clear_error_that_leaves_nothing(tmp_path, spawner):
    junk = tmp_path / "junk.qcow2"
    junk.write_bytes(b"QFI\xfb" + b"\xff" * 100)   # a qcow2 magic and a broken header
    for image, words in ((tmp_path / "missing.qcow2", "does not exist"), (junk, "")):
        with pytest.raises((RuntimeError, FileNotFoundError)) as err:
            spawner.submit(Machine.start, VMSpec(base_image=str(image)), workdir=tmp_path).result()
        assert words in str(err.value)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("vm-")] == []
    assert subprocess.run(["pgrep", "-f", f"qemu-system.*{tmp_path}"], capture_output=True).returncode == 1


def test_qemu_dies_with_a_sigkilled_owner(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
from cua_rl.local_gym import procs
from cua_rl.local_gym.vm.machine import Machine, VMSpec
vm = procs.Spawner(1).submit(Machine.start, VMSpec(memory_mib=64), workdir=Path({str(tmp_path)!r})).result()
print(vm.proc.pid, flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    try:
        qemu = int(owner.stdout.readline())
        assert Path(f"/proc/{qemu}").exists()
        owner.kill()
        owner.wait(10)
        assert wait_gone({qemu}) == set(), "QEMU outlived the process that started it"
    finally:
        if owner.poll() is None:
            owner.kill()
    time.sleep(0.1)


def test_a_snapshot_puts_the_machine_back_without_a_boot(tmp_path, spawner):
    vm = spawner.submit(Machine.start, VMSpec(base_image=str(_base(tmp_path)), memory_mib=128),
                        workdir=tmp_path).result()
    try:
        assert wait_for_screen(vm, lambda p: _colours(p) > 1, timeout_s=30) is not None
        vm.save_snapshot("ready")
        vm.qmp.hmp('qemu-io virtio0 "write -P 0xcd 0 64k"')
        t0 = time.monotonic()
        vm.load_snapshot("ready")
        print(f"loadvm of a 128 MiB machine ({vm.accel}): {(time.monotonic() - t0) * 1e3:.0f} ms")
        assert vm.status() == "running"
        # the disk is back too: the first 64 KiB read as the zeros they were at the snapshot
        log = vm.root / "qemu.log"
        vm.qmp.hmp('qemu-io virtio0 "read -P 0 0 64k"')
        assert procs.wait_until(lambda: "read 65536/65536" in log.read_text(), 5.0), log.read_text()
        assert "Pattern verification failed" not in log.read_text()
        with pytest.raises(Exception, match="nosuch"):
            vm.load_snapshot("nosuch")
        assert vm.status() != "running"   # a failed reset leaves the machine stopped: its execution must end
    finally:
        spawner.submit(vm.stop).result()
