"""Suite-wide set-up shared by every test folder: the logging fix, the one-process torch world, the session's
tiny model and vLLM server, the quick tier's marker, and the test budget's report."""

import json
import os
import time
from pathlib import Path

import pytest

from cua_rl.http.serve import free_port
from cua_rl.logs import keep_stdlib_logging

# AReaL's getLogger detaches the stdlib root logger on every call; without this our loggers (and pytest's
# caplog) stop hearing INFO/WARNING lines as soon as any test module imports areal.
keep_stdlib_logging()


@pytest.fixture
def dist_env(monkeypatch, tmp_path):
    """A one-process torch.distributed world (gloo on the CPU) and a private name-resolve root, as AReaL's
    trainer expects; the process group is destroyed afterwards."""
    import torch.distributed as dist
    from areal.api.cli_args import NameResolveConfig
    from areal.utils import name_resolve

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=str(tmp_path / "name_resolve")))
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- the quick tier (scripts/test.sh --quick = -m "not slow"): no vLLM, no trainer, no training run ---------
# A test is slow when it starts one of those (it asks for one of these fixtures, or is an e2e run) or is
# named in SLOW_TESTS (the browser and VM suites and the other tests of many seconds: docs/testing.md).
SLOW_FIXTURES = {"vllm_server", "dist_env"}
# Tests (node id prefixes) of many seconds each, with what they cost in a quick-tier run on 2 cores.
SLOW_TESTS = {
    "tests/local_gym/test_miniwob.py": "a Chromium per desktop, 90 s for the file",
    "tests/local_gym/test_vm_gym.py": "QEMU guests under TCG, 110 s (+ 6 keyboard-suite tasks, 20 s; + a fork, 31 s)",
    "tests/local_gym/test_fork_miniwob.py": "a MiniWoB++ page forked into two Chromium desktops, 12-24 s",
    "tests/local_gym/test_miniwob_cross_check.py::test_a_grid_click_on_the_button_solves_a_real_reference_episode_at_scale_3":
        "the miniwob package's own environment (Selenium, Chromium at scale 3), one episode, 5 s",
    "tests/sft/test_miniwob_demos.py": "two MiniWoB++ gyms (Chromium): DOM demonstrations (one turned into rows with "
        "the tiny model's processor, one through the SFT build's config path), two random-target episodes, 23 s",
    "tests/local_gym/test_fork.py::test_a_declared_volatile_region": "five xterm desktops with a clock forked, 5 s",
    "tests/local_gym/test_vm.py": "QEMU without a guest OS",
    "tests/local_gym/test_task_solutions.py": "every built-in task and the keyboard suite solved on desktops, 31 + 35 s",
    "tests/local_gym/test_curriculum.py::test_scripted_solutions": "every curriculum family solved, 13 s",
    "tests/run/test_cli.py::test_train_sh_dry_run_end_to_end": "train.sh with set-up and the launcher, 58 s",
    "tests/run/test_gpu_first_try.py::test_gpu_first_try_2_the_default_recipe_uses_all_of_1_2_4_8_gpus":
        "four dry runs under a fake nvidia-smi and AReaL's scheduler on each config, 10-23 s",
    "tests/logs/test_keep_stdlib_logging.py": "launcher and AReaL subprocesses, 26 s",
    "tests/docs/test_wheel.py": "the wheel built, installed into a venv, cua-train run three times, 60 s; a gym "
        "host's venv (the wheel's base install from uv's cache) serving a real desktop, 15 s",
    "tests/docs/test_two_clones.py": "a second clone's set-up (relinking the shared environment) and this clone's "
        "again, 10-25 s",
    "tests/genv/test_fleet.py::test_a_group_whose_host_dies_mid_episode_is_played_again_on_another_host":
        "two gyms, four real desktops, one gym stopped mid-episode, 7 s",
    "tests/genv/test_fleet.py::test_a_host_that_reports_room_but_answers_429_is_drained_and_rejoins_after_a_cool_down":
        "a 429 host found out over three of the client's create waits (2 s, then 4 s), 7 s",
    "tests/run/test_embedded_gym_options.py": "the embedded stack's MiniWoB++ gym twice, two Chromium episodes each, 18 s",
    "tests/policy/test_tool_calls.py::test_the_parser_is_vllms_hermes_parser": "imports vLLM's chat serving, 10 s",
    "tests/local_gym/test_live_view.py::test_a_desktop_cannot_reconfigure_its_live_view":
        "the live view attack typed into a desktop, a viewer over RFB, 5 s",
    "tests/local_gym/test_sandbox.py::test_fifo_link_swaps_and_a_server_grab": "cua-gym serve, four desktops, "
        "three swapping files (one grabbing its X server) under evaluates for 3 s, SIGTERM, 14 s",
    "tests/local_gym/test_api.py::test_a_save_as_whose_file_chooser_is_stopped":
        "a keyboard-suite save-as with mousepad stopped for 5 s, 9 s",
    "tests/local_model/test_serve_checkpoint.py": "AReaL's saver, cua-model export, vLLM started on the export, 58 s",
    "tests/local_model/test_gpu_smoke.py::test_the_cpu_run_of_the_smoke_check": "bench/gpu_smoke.py on the CPU: "
        "AReaL's FSDP engine, one step of two rows, a disk weight update; 43 s of CPU, 100 s at load 5",
    "tests/docs/test_documented_commands.py": "every documented command's --help or --dry-run (17 dry-runs in process, 21 --help forms 2 at a time), 75 s at load 8 on 2 cores, 280 s at load 13",
}


def pytest_addoption(parser):
    parser.addoption("--reverse", action="store_true",
                     help="run the tests in reverse order (tests sharing a server must pass either way)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        starts_run = bool(item.get_closest_marker("e2e") or SLOW_FIXTURES & set(item.fixturenames))
        if starts_run or any(item.nodeid.startswith(prefix) for prefix in SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
        _check_lane(item, starts_run)
    if hasattr(config, "workerinput"):   # a lane of scripts/test.sh's run (a pytest-xdist worker)
        items.sort(key=lambda item: _unit_order(lane_unit(item.nodeid)))   # stable: a unit keeps its order
    if config.getoption("--reverse"):
        items.reverse()


# ---- the lanes: scripts/test.sh runs the suite in two pytest-xdist workers (LaneScheduling) on 2 cores or more ----
# A one-lane run left the 2-core machine a third idle (start-ups, desktops and time-outs waiting: docs/testing.md),
# so a second lane runs tests beside the first (docs/testing.md "Two lanes" says what failed beside the runs before
# the runs lane worked at nice 5, RUNS_LANE_NICE; CUA_RL_TEST_LANES=1 runs one lane). Two runs at once do not gain:
# vLLM and the trainers spread their threads over both cores, and two of them beside each other took twice as long
# each (session 31). So the first lane, "runs", takes the units that start vLLM, AReaL's trainer or a training run
# (RUN_UNITS, in that order), then anything left; the second, "desktops", takes only the others (desktops,
# browsers, VMs, unit tests), longest first (UNIT_S, measured). A unit goes to one lane whole: a test module (its
# module fixtures start once), or the modules sharing a session fixture (SHARED_UNITS: one vLLM server, one
# PostgreSQL). Tests that show nothing was left running count only their own lane's processes (tests/hosts.py
# ``pids(..., here=True)``).
SHARED_UNITS = {   # checked at collection: a test asking for vllm_server outside these modules is refused
    "vllm-server": ("tests/workflow/test_workflow_episode.py", "tests/local_agent/test_agent_real_model.py",
                    "tests/local_model/test_vllm_cpu.py", "tests/monitor/test_workflow_monitor.py",
                    "tests/policy/test_gates_server.py", "tests/policy/test_gates_trainer.py",
                    "tests/policy/test_tool_calls.py", "tests/policy/test_warm_up.py",
                    "tests/evaluate/test_cua_eval.py"),
    "postgres": ("tests/monitor/",),
}
# the runs lane's units, in its order (module prefixes); checked at collection: a test that starts vLLM, the trainer
# or a run (the slow tier's fixtures, the e2e marker) outside them is refused. The gate last: its steps leave the
# least of the machine idle for the desktops lane beside it.
# A unit takes the place of the longest prefix that names it (the gate's own entry over tests/e2e/). tests/workflow/:
# the workflow's modules that tests/e2e held before issue 87 (desktops, scripted agents and models), in this lane since.
RUN_UNITS = ("tests/e2e/test_gym_fleet.py", "tests/e2e/test_health_stop.py", "tests/e2e/test_faults.py",
             "tests/e2e/test_resume.py", "tests/e2e/", "tests/workflow/", "vllm-server",
             "tests/policy/test_gates_lora.py", "tests/sft/test_sft.py", "tests/local_model/test_serve_checkpoint.py",
             "tests/local_model/test_gpu_smoke.py", "tests/e2e/test_learning_gate.py")
UNIT_S = {   # the desktops lane's units of 20 s or more: seconds in one lane, session 31 (Intel Xeon, 2 cores)
    "tests/local_gym/test_vm_gym.py": 187, "tests/local_gym/test_task_solutions.py": 69,
    "tests/local_gym/test_miniwob.py": 53, "tests/run/test_cli.py": 51, "postgres": 45,
    "tests/docs/test_wheel.py": 35, "tests/config/test_config_loading.py": 35,
    "tests/trainer/test_trainer_close.py": 32, "tests/local_agent/test_agent_desktop.py": 32,
    "tests/local_gym/test_curriculum.py": 26, "tests/local_gym/test_api.py": 26,
    "tests/docs/test_documented_commands.py": 25, "tests/logs/test_keep_stdlib_logging.py": 23,
    "tests/local_gym/test_sandbox.py": 21,
}


# Beside the desktops lane, the runs lane works at a lower priority (its vLLM, trainers, gyms and agents inherit it):
# the desktops lane's tests wait on screens and time-outs sized for a machine of their own (session 31: they failed
# beside the runs at equal priority), while a run's waits are long and the runs lane has the idle time of its
# start-ups and episodes to give. Nice 5 against 0 gives the desktops lane about three quarters of a contended core.
RUNS_LANE_NICE = 5


def pytest_configure(config):
    worker = getattr(config, "workerinput", None)
    if worker and worker["workerid"] == "gw0" and int(worker.get("workercount", 1)) > 1:
        os.nice(RUNS_LANE_NICE)


def lane_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the shared fixture's unit its module is in."""
    module = nodeid.split("::")[0]
    for unit, modules in SHARED_UNITS.items():
        if any(module.startswith(prefix) for prefix in modules):
            return unit
    return module


def run_rank(unit: str) -> int | None:
    """The unit's place in the runs lane's order (its longest prefix in RUN_UNITS), or None for a desktops-lane
    unit."""
    named = [(len(prefix), i) for i, prefix in enumerate(RUN_UNITS) if unit.startswith(prefix)]
    return max(named)[1] if named else None


def _unit_order(unit: str) -> tuple:
    rank = run_rank(unit)
    return (0, rank, 0) if rank is not None else (1, 0, -UNIT_S.get(unit, 0))


def _check_lane(item, starts_run: bool) -> None:
    """``starts_run``: the test starts vLLM, the trainer or a run (the slow tier's fixtures, the e2e marker)."""
    unit = lane_unit(item.nodeid)
    if "vllm_server" in item.fixturenames and unit != "vllm-server":
        raise pytest.UsageError(f"{item.nodeid} uses the session's vLLM server: add its module to "
                                "SHARED_UNITS['vllm-server'] in tests/conftest.py (one server per lane)")
    if starts_run and run_rank(unit) is None:
        raise pytest.UsageError(f"{item.nodeid} starts vLLM, the trainer or a run: add its module to RUN_UNITS in "
                                "tests/conftest.py (runs share the runs lane, never beside each other)")


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scope scheduling with our units as scopes and the two lanes' roles (its own ``loadgroup``
    marks group nothing under pytest 9, which ignores the node id it rewrites)."""
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_unit(nodeid)

        def _assign_work_unit(self, node) -> bool:
            """The next unit this node's lane takes (the runs lane is gw0): False when none is left for it."""
            runs_lane = node.gateway.id == "gw0"
            scope = next((u for u in self.workqueue if runs_lane or run_rank(u) is None), None)
            if scope is None:
                return False
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])
            return True

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            pending = self._pending_of(self.assigned_work[node])
            if not self.workqueue:
                node.shutdown()
            elif pending <= 2 and not self._assign_work_unit(node) and pending == 0:
                node.shutdown()   # a desktops lane with nothing of its own left: the runs lane ends the rest

    return LaneScheduling(config, log)


# ---- the tiny model and real vLLM, one of each per session (vLLM takes a minute or two to start) ----------
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from cua_rl.local_model import build_tiny

    return str(build_tiny(tmp_path_factory.mktemp("tiny-qwen3-vl") / "model", seed=0))


@pytest.fixture(scope="session")
def processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """AReaL's vLLM server (vllm-cpu) serving the tiny model, started the way AReaL starts it. Tests that
    load other weights into it must load ``tiny_model_dir`` back before they end (``restore_weights``). Its chat
    route parses tool calls as ``vllm serve --enable-auto-tool-choice --tool-call-parser hermes`` does
    (tests/policy/test_tool_calls.py compares the endpoint's answers with it)."""
    from cua_rl.local_model.vllm_server import VLLMServer

    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VLLMServer(tiny_model_dir, log_path=log, tool_call_parser="hermes")
    print(f"\n[vllm] AReaL's vLLM server healthy after {server.startup_s:.0f} s (log {log})")
    yield server
    server.stop()



@pytest.fixture
def browser(tmp_path):
    """Real headless Chromium driven by Selenium (tests/chromium.py), one per test."""
    from tests.chromium import driver

    with driver(tmp_path / "chromium") as chrome:
        yield chrome


# ---- the test budget: a time per test folder, the slowest tests, and a stop before CI's limit -------------
# CI must finish within 90 minutes (the suite's budget is 35, docs/testing.md); a suite that runs long says
# so itself, naming what ran long, instead of being cut off with nothing printed.
# 84 minutes: session 32's rehearsal on a slow hour of its machine took 71 (75, the stop before, left no room).
BUDGET_STOP_S = float(os.environ.get("CUA_RL_TEST_STOP_S", 84 * 60))
_folder_s: dict[str, float] = {}
_test_s: dict[str, float] = {}
_started = time.monotonic()
_started_wall = time.time()
_timeline: dict[str, list[list]] = {}   # lane -> [start offset, test, seconds], in the order the lane ran them
TIMES = Path(__file__).resolve().parents[1] / "build" / "test-times.json"   # the last run's times (build/ is ignored)


def _folder(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    _folder_s[_folder(nodeid)] = _folder_s.get(_folder(nodeid), 0.0) + report.duration
    _test_s[nodeid] = _test_s.get(nodeid, 0.0) + report.duration
    lane = getattr(report, "worker_id", None) or "main"   # pytest-xdist names the worker that ran it
    if report.when == "setup":
        _timeline.setdefault(lane, []).append([round(report.start - _started_wall, 1), nodeid, 0.0])
    if _timeline.get(lane) and _timeline[lane][-1][1] == nodeid:
        _timeline[lane][-1][2] = round(report.stop - _started_wall - _timeline[lane][-1][0], 1)


def _longest(n: int) -> list[str]:
    return [f"{s:8.1f} s  {nodeid}" for nodeid, s in sorted(_test_s.items(), key=lambda kv: -kv[1])[:n]]


def pytest_runtest_teardown(item, nextitem):
    elapsed = time.monotonic() - _started
    if elapsed > BUDGET_STOP_S and not item.session.shouldfail:
        lines = "\n".join(_longest(10))
        item.session.shouldfail = (f"the suite passed its time limit ({elapsed / 60:.0f} min > "
                                   f"{BUDGET_STOP_S / 60:.0f} min); the tests that ran longest:\n{lines}")
        item.config.get_terminal_writer().line(f"\n[budget] STOPPING: {item.session.shouldfail}", red=True)
        item.session.shouldstop = item.session.shouldfail


def pytest_terminal_summary(terminalreporter):
    if not _folder_s or hasattr(terminalreporter.config, "workerinput"):
        return
    tr = terminalreporter
    tr.section("time per test folder (setup + call + teardown)")
    for folder, s in sorted(_folder_s.items(), key=lambda kv: -kv[1]):
        tr.write_line(f"{s:8.1f} s  {folder}")
    tr.write_line(f"{sum(_folder_s.values()):8.1f} s  in tests; pytest's wall time "
                  f"{time.monotonic() - _started:.0f} s")
    # every test's time, longest first, for the ledger (docs/notes/ci-ledger.md): what the 25 slowest leave out
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps({"wall_s": round(time.monotonic() - _started, 1),
                                 "folders": {f: round(s, 1) for f, s in sorted(_folder_s.items(), key=lambda kv: -kv[1])},
                                 "tests": {n: round(s, 2) for n, s in sorted(_test_s.items(), key=lambda kv: -kv[1])},
                                 "lanes": _timeline},
                                indent=1) + "\n")
    tr.write_line(f"every test's time: {TIMES}")


# ---- the launcher's --dry-run, in process (tests/config, tests/dataset) ----------------------------------
@pytest.fixture
def launcher(monkeypatch, tmp_path, capsys):
    """``launch.main(["--dry-run", ...])`` in process with a clean environment (no flag variables, no .env files,
    CUA_RL_FILEROOT in tmp_path): ``run(args, device)`` -> (exit code, the report's "key: value" lines, the
    overrides listed, captured output). ``offline`` (the default): ``--offline``, no probes of the services named
    (tests/run/test_probes.py probes real ones)."""
    from cua_rl.run import cli, launch

    for flag in cli.FLAGS:
        monkeypatch.delenv(flag.env, raising=False)
    monkeypatch.delenv("MONITOR_PROJECT_TOKEN", raising=False)
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    monkeypatch.setattr(cli, "default_env_files", lambda _root: [])

    def run(args, device="cpu", offline=True):
        monkeypatch.setenv("CUA_RL_DEVICE", device)
        rc = launch.main(["--dry-run", *(["--offline"] if offline else []), *args])
        out = capsys.readouterr()
        lines = out.out.splitlines()
        report = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in lines if ": " in line
                  and not line.startswith("  ")}
        overrides = [line.strip() for line in lines if line.startswith("  ")]
        return rc, report, overrides, out
    return run


@pytest.fixture
def file_server(tmp_path):
    """A plain file server (``python -m http.server``'s handler, in a thread) on loopback: a server that speaks
    HTTP and none of our protocols. Its base URL; stopped after the test."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_args) -> None:
            pass

    (tmp_path / "index.html").write_text("<html><body>files</body></html>")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)
