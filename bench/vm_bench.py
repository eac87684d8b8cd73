"""Benchmark of the gym's VM desktops on the tiny test guest (``vm/guest_image.py``); prints one JSON object.

Measures, in process (``LocalGym``, the same code the HTTP routes call), on this machine's accelerator
(TCG here: its nested KVM does not boot Linux):
  - boot: a template machine from QEMU start to the guest agent answering, and saving its state;
  - resume: an execution's machine from QEMU start (``-incoming`` the saved state) to the agent answering;
  - create-execution cold (resume + the task's set-up through the agent) and warm (a spare the pool
    resumed beforehand: the "reset" an episode sees between two executions of the same VM);
  - snapshot reset inside a running execution (loadvm of an internal snapshot of its overlay);
  - step: a one-character type action with its settle wait, a click, a screenshot (PNG), an evaluate.

  python bench/vm_bench.py              # ~1 minute on 2 cores
  python bench/vm_bench.py --boots 3 --n 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from gym_bench import summary  # p50/p90/p99 and n; every figure here is in milliseconds

from cua_rl.local_gym import procs
from cua_rl.local_gym.env import LocalGym
from cua_rl.local_gym.manager import GymOptions
from cua_rl.local_gym.tasks import load_tasks
from cua_rl.local_gym.vm import backend, guest_image

TASKS = Path(__file__).resolve().parents[1] / "examples" / "vm_tasks"
TASK = "901"
KVM_EXPECTATION = (
    "unmeasured here (no KVM that boots Linux on this machine). Under KVM the guest's own work runs at near "
    "native speed, so boot (firmware, kernel, init: 6-7 s under TCG for this guest) should drop to ~1-2 s; "
    "resume is dominated by reading the state file (~90 MiB, mostly the framebuffer and zero pages) and by "
    "QEMU's start, which KVM does not change much; a Windows guest's first boot takes minutes either way "
    "(~150 s in the Windows-VM example with KVM), which is why it happens once per gym, not per episode.")


def boots(spec, n: int) -> dict:
    boot, save, size = [], [], 0
    spawner = procs.Spawner(1)
    try:
        for _ in range(n):
            with tempfile.TemporaryDirectory() as tmp:
                tpl = spawner.submit(backend.boot_template, spec, Path(tmp), 60.0).result()
                boot.append(tpl.boot_s * 1e3)
                save.append(tpl.save_s * 1e3)
                size = tpl.state.stat().st_size
    finally:
        spawner.close()
    return {"boot_ms": summary(boot), "save_state_ms": summary(save), "state_mib": round(size / 2**20, 1)}


async def in_gym(n: int) -> dict:
    out: dict = {}
    opts = GymOptions(tasks_dir=str(TASKS), pool_size=1, max_spares=1, x_spares=0)
    async with LocalGym(opts) as gym:
        m = gym.manager
        spec = gym.task(TASK).desktop_spec(1280, 800)
        first = time.monotonic()
        eid = (await gym.reset(TASK))["execution_id"]   # boots the template
        out["first_create_with_template_boot_ms"] = round((time.monotonic() - first) * 1e3, 1)
        await gym.terminate(eid)

        resume = []
        for _ in range(n):
            t0 = time.monotonic()
            desk = await asyncio.wrap_future(m._create_spawner.submit(backend.VMDesktop.start, spec,
                                                                      workdir=m.workdir, timeout_s=30.0))
            resume.append((time.monotonic() - t0) * 1e3)
            await asyncio.to_thread(desk.stop)
        out["resume_ms"] = summary(resume)

        warm, cold = [], []
        for _ in range(n):
            for _ in range(300):
                if m.pool_stats()["spares"]:
                    break
                await asyncio.sleep(0.05)
            t0 = time.monotonic()
            r = await gym.reset(TASK)
            (warm if r["warm"] else cold).append((time.monotonic() - t0) * 1e3)
            await gym.terminate(r["execution_id"])
        out["create_warm_ms"] = summary(warm)
        m.opt.pool_size = 0
        for desk in [d for q in m._spares.values() for d in q]:
            await m._destroy_async(desk)
        m._spares.clear()
        for _ in range(n):
            t0 = time.monotonic()
            r = await gym.reset(TASK)
            cold.append((time.monotonic() - t0) * 1e3)
            await gym.terminate(r["execution_id"])
        out["create_cold_ms"] = summary(cold)

        eid = (await gym.reset(TASK))["execution_id"]
        vm = m.executions[eid].desktop.machine
        t0 = time.monotonic()
        await asyncio.to_thread(vm.save_snapshot, "ready")
        out["savevm_ms"] = round((time.monotonic() - t0) * 1e3, 1)
        loads, typed, clicks, shots, evals = [], [], [], [], []
        for i in range(n):
            await gym.act(eid, {"type": "type", "text": "echo x > /root/x.txt\n"})
            t0 = time.monotonic()
            await asyncio.to_thread(vm.load_snapshot, "ready")
            loads.append((time.monotonic() - t0) * 1e3)
        assert m.executions[eid].desktop.files.read("x.txt", 10) is None, "loadvm did not put the disk back"
        for i in range(n):
            t0 = time.monotonic()
            await gym.act(eid, {"type": "type", "text": "a"})
            typed.append((time.monotonic() - t0) * 1e3)
            t0 = time.monotonic()
            await gym.act(eid, {"type": "click", "x": 0.5, "y": 0.5})
            clicks.append((time.monotonic() - t0) * 1e3)
            t0 = time.monotonic()
            await gym.screenshot(eid)
            shots.append((time.monotonic() - t0) * 1e3)
        for _ in range(max(3, n // 3)):
            t0 = time.monotonic()
            await gym.evaluate(eid)
            evals.append((time.monotonic() - t0) * 1e3)
        out.update(snapshot_reset_ms=summary(loads), step_type_one_char_ms=summary(typed),
                   step_click_ms=summary(clicks), screenshot_png_ms=summary(shots),
                   evaluate_5_validators_ms=summary(evals))
        await gym.terminate(eid)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boots", type=int, default=3)
    ap.add_argument("--n", type=int, default=10)
    args = ap.parse_args()
    os.environ[guest_image.ENV] = str(guest_image.ensure())
    spec = load_tasks(TASKS).get(TASK).desktop_spec(1280, 800)
    qemu = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    result = {"bench": "vm_bench", "guest": "tiny Debian kernel + busybox + qemu-ga (scripts/build_vm_test_image.sh)",
              "accel": "/".join(spec.vm.accel), "memory_mib": spec.vm.memory_mib, "qemu": qemu,
              "cpus": os.cpu_count(), **boots(spec, args.boots), **asyncio.run(in_gym(args.n)),
              "kvm_expectation": KVM_EXPECTATION}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
