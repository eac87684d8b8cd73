"""cua_rl.run.console.TrainerConsole on recorded AReaL 1.0.4 output: one GRPO step of a CPU run
(data/areal_step_output.txt, copied from a launcher console) loses its statistics table, a default run's start
(data/cpu_run_start.txt) shows its milestones and the trainer's own lines, the rollout workers' per-episode lines
stay in the logs, and an error keeps its traceback's last line."""

import re
import sys
from pathlib import Path

from cua_rl.run.console import TrainerConsole

STEP = (Path(__file__).parent / "data" / "areal_step_output.txt").read_text()


def _run(console: TrainerConsole, text: str) -> list[str]:
    out = []
    for line in text.splitlines(keepends=True):
        out += console.feed(line)
    return out + console.close()


def test_the_statistics_table_is_dropped_and_the_rest_passes():
    """AReaL's table of ~100 statistics leaves the console (every value is in metrics.jsonl); the console makes
    no step line of it: the trainer prints its own, from the batch it trained (cua_rl/trainer/progress.py)."""
    out = _run(TrainerConsole(total_steps=20, log_file="/runs/x/train.log"), STEP)
    assert not any(line.startswith("[cua-rl] step") for line in out), "the step line is the trainer's, not the table's"
    assert not any("│" in line or "╒" in line or "Stats (1/1)" in line or "Train step 1/1000" in line for line in out)
    # every line that is not the table or its header passes through unchanged, in order
    kept = [line for line in STEP.splitlines(keepends=True)
            if "│" not in line and "╒" not in line and "├" not in line and "╘" not in line
            and "StatsLogger" not in line]
    assert out == kept


def test_a_table_at_the_very_end_is_dropped_too():
    second = STEP.replace("Train step 1/1000", "Train step 2/1000").splitlines(keepends=True)
    end = next(i for i, line in enumerate(second) if "╘" in line)   # the output stops inside the table
    out = _run(TrainerConsole(quiet=True), STEP + "".join(second[:end]))
    assert not any("│" in line or "├" in line for line in out)


def test_lines_with_box_characters_outside_a_step_pass_through():
    line = "│ a user's own table │ 1 │\n"
    assert TrainerConsole().feed(line) == [line]


# --- quiet (the launcher's default) ----------------------------------------------------------------
START = (Path(__file__).parent / "data" / "cpu_run_start.txt").read_text()   # train.log of a default CPU run:
# AReaL's and vLLM's start-up, the rollout workers' notes and the first two steps (450 lines)


def test_quiet_console_shows_milestones_and_the_trainers_own_lines_only():
    out = _run(TrainerConsole(total_steps=24, log_file="/runs/x/train.log", quiet=True), START)
    assert len(out) <= 8, out
    milestones = [line.split(" (")[0] for line in out if line.startswith("[cua-rl]")]
    assert milestones == ["[cua-rl] training engine ready", "[cua-rl] vLLM starting",
                          "[cua-rl] vLLM serving at http://192.0.2.2:10743",
                          "[cua-rl] inference engine ready; rollouts begin"]
    others = [line for line in out if not line.startswith("[cua-rl]")]
    assert others and all(" cua-train INFO:" in line for line in others), others
    assert any(" cua-train INFO: train tasks:" in line for line in others), "the trainer's own logger shows"
    assert not any("APIServer" in line or "EngineCore" in line or "Writing model shards" in line for line in out)
    assert not any("(AReaL)" in line and " cua-train " not in line for line in out)


# the per-episode lines of a rollout worker (AReaL's local scheduler copies its output into the trainer's), as
# the 16-step run of 2026-11-29 printed them on the console, 1,954 of 2,049 lines
EPISODE_LINES = [
    "2026-11-29 05:49:07,911 INFO cua_rl.genv.client: created execution 5f0c (task 054-key-sequence, device None)\n",
    "2026-11-29 05:49:07,913 INFO cua_rl.mini_agent.client: agent run r-17 started for execution 5f0c\n",
    "2026-11-29 05:49:08,001 INFO cua_rl.policy.endpoint: episode e-3: ignoring client fields ['max_tokens', "
    "'temperature', 'top_p'] (sampling comes from the trainer's gconfig)\n",
    "2026-11-29 05:49:31,520 WARNING cua_rl.policy.endpoint: episode e-3: output was interrupted (2 attempts, policy "
    "versions [0, 1]) and vLLM resumes a vision request by regenerating from the messages; regenerating, try 1\n",
    "2026-11-29 05:49:40,020 INFO cua_rl.workflow.group: task 054-key-sequence episode 2: reward=1.000\n",
    "2026-11-29 05:49:40,100 INFO cua_rl.genv.client: terminated execution 5f0c\n",
]


def test_quiet_console_keeps_the_rollout_workers_per_episode_lines_in_the_logs():
    """cua_rl lines at INFO are the workers' per-episode lines (train.log and rollout.log keep them); the
    console shows cua_rl lines from WARNING up. The one WARNING in the list became INFO in the policy endpoint
    (an interrupted output is normal under async RL, and the summary counts them): as recorded, it still shows."""
    console = TrainerConsole(quiet=True)
    shown = [line for line in EPISODE_LINES if console.feed(line)]
    assert shown == [EPISODE_LINES[3]], shown


def test_the_trainers_step_lines_pass():
    line = ("[cua-rl] step 3/16: success 0.625, reward 0.656 (16 episodes, 4 groups, 58 rows); 24s, elapsed "
            "1m20s, ETA 5m12s\n")
    assert TrainerConsole(quiet=True).feed(line) == [line]


def test_quiet_console_keeps_every_error_whatever_its_format():
    errors = ["\x1b[31m(AReaL) 20261125-00:50:24.607 RolloutController ERROR: rollout failed\x1b[0m\n",
              "(EngineCore pid=9999) ERROR 11-25 00:49:30 [core.py:1] engine died\n",
              "2026-11-25 00:47:18,302 ERROR areal.x: boom\n",
              "2026-11-25 00:47:18,302 WARNING cua_rl.workflow: an episode was dropped\n",
              "(AReaL) 20261125-01:19:32.199 cua-train INFO: baseline (policy version 0): reward 0.000\n"]
    console = TrainerConsole(quiet=True)
    assert [console.feed(line) for line in errors] == [[line] for line in errors]
    hidden = ["(AReaL) 20261125-00:50:24.607 FileSystemUtils WARNING: not on a network filesystem\n",
              "(APIServer pid=1) WARNING 11-25 00:48:37 [system_utils.py:289] Found ulimit\n",
              "2026-11-25 00:47:18,302 INFO torch._inductor: compiling\n", "Writing model shards: 100%\n"]
    assert [console.feed(line) for line in hidden] == [[] for _ in hidden]
    assert TrainerConsole(quiet=False).feed(hidden[0]) == [hidden[0]], "CUA_RL_CONSOLE=full shows everything"


# An ERROR with its traceback (AReaL's RLTrainer logs the failure, then Python prints the traceback; a chained
# exception in between), injected into a real step's output.
FAILURE = """\x1b[31m(AReaL) 20261129-05:51:02.114 RLTrainer ERROR: Training failed with exception: boom\x1b[0m
Traceback (most recent call last):
  File "/x/areal/trainer/rl_trainer.py", line 611, in train
    rollout_batch = self.actor.prepare_batch(
                    ^^^^^^^^^^^^^^^^^^^^^^^^^
KeyError: 'rewards'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/cua_rl/train.py", line 99, in main
    trainer.train(
RuntimeError: Failed to call method 'prepare_batch'
    on the rollout worker: connection reset
(AReaL) 20261129-05:51:02.200 cua-train INFO: closing
"""


def test_an_error_shows_with_its_tracebacks_last_line_and_where_the_rest_is():
    out = _run(TrainerConsole(log_file="/runs/x/train.log", quiet=True), STEP + FAILURE)
    assert out[0].startswith("\x1b[31m(AReaL) 20261129-05:51:02.114 RLTrainer ERROR: Training failed"), out
    assert out[1] == ("[cua-rl] traceback: RuntimeError: Failed to call method 'prepare_batch' "
                      "(the whole traceback: /runs/x/train.log)"), out
    assert out[2:] == ["(AReaL) 20261129-05:51:02.200 cua-train INFO: closing\n"], out
    # a traceback that ends the output is told by close(); one under a hidden log line stays hidden
    out = _run(TrainerConsole(log_file="/runs/x/train.log", quiet=True), FAILURE.rsplit("(AReaL)", 1)[0])
    assert out[-1].startswith("[cua-rl] traceback: RuntimeError: Failed to call method"), out
    hidden = "2026-11-29 05:49:07,911 INFO cua_rl.genv.client: retrying\n" + FAILURE.split("\n", 1)[1]
    assert _run(TrainerConsole(quiet=True), hidden) == ["(AReaL) 20261129-05:51:02.200 cua-train INFO: closing\n"]


def test_on_a_terminal_the_steps_draw_a_bar_and_the_lines_print_above_it():
    """Through a Progress that believes it writes to a terminal: the milestones become a start-up bar, the step
    lines still print (above the steps' bar), and the bar reaches the last step."""
    import io

    from cua_rl.progress import Progress

    buffer = io.StringIO()
    progress = Progress(out=buffer, tty=True)
    console = TrainerConsole(total_steps=2, log_file="/runs/x/train.log", quiet=True, progress=progress)
    steps = [f"[cua-rl] step {n}/2: success 0.{n}00, reward 0.{n}00 (16 episodes, 4 groups, 16 rows); 20s, "
             f"elapsed {n * 20}s, ETA {40 - n * 20}s\n" for n in (1, 2)]
    out = _run(console, START + "".join(steps))
    for line in out:
        progress.write(line.rstrip("\n"))
    progress.end()
    assert not any(line.startswith("[cua-rl] training engine ready") for line in out), "a bar, not lines"
    assert [line for line in out if line.startswith("[cua-rl] step")] == steps
    drawn = buffer.getvalue()
    assert "start-up: 4/4, inference engine ready; rollouts begin [" in drawn, drawn[-2000:]
    assert "steps: 100%" in drawn and "| 2/2 [" in drawn and ", success 0.200]" in drawn, drawn[-2000:]


def test_the_summary_lists_each_steps_value_and_marks_a_missing_one():
    from cua_rl.run.summary import by_step

    steps = {1: {"trained/success": 0.78125}, 2: {"trained/success": 0.5}, 4: {"trained/success": 1.0}}
    assert by_step(steps, "trained/success") == "steps 1-4: 0.781 0.500 - 1.000"


def test_the_statistics_are_read_back_by_step_from_metrics_jsonl(tmp_path):
    """What the e2e tests and the trainer bench check of AReaL's statistics they read from the run's
    metrics.jsonl (StepProgress writes it at each commit), keyed by AReaL's global_step, text values skipped."""
    from cua_rl.run.summary import read_scalars
    from cua_rl.trainer.progress import StepProgress

    progress = StepProgress(tmp_path, total_steps=2)
    progress.committed(0, {"rollout/reward": 0.25, "timeperf/train_step": 3, "note": "text"})
    progress.committed(1, {"rollout/reward": 0.75, "timeperf/train_step": 4})
    scalars = read_scalars(tmp_path)
    assert scalars["rollout/reward"] == [(0, 0.25), (1, 0.75)] and scalars["timeperf/train_step"] == [(0, 3.0), (1, 4.0)]
    assert "note" not in scalars and "step" not in scalars and [v for _, v in scalars["step_seconds"]]


def test_a_failed_run_names_a_dead_model_server_as_its_cause(tmp_path):
    """The lines AReaL 1.0.4 wrote when vLLM was SIGKILLed mid-run (tests/e2e/test_faults.py kills it for real);
    a failure without them gets no guessed cause."""
    from cua_rl.run.summary import failure_cause

    log = tmp_path / "train.log"
    log.write_text(
        "(AReaL) 20261125-07:31:06.105 EngineBP ERROR: Engine method 'pause_generation' failed: Failed after 3 "
        "retries each. Payload: {}. Addr: 192.0.2.2:10743. Endpoint: /areal_pause_generation. Last error: "
        "ClientConnectorError(ConnectionKey(host='192.0.2.2', port=10743), ConnectionRefusedError(111, "
        "\"Connect call failed ('192.0.2.2', 10743)\"))\n"
        "(AReaL) RLTrainer ERROR: Training failed with exception: Failed to call method 'update_weights'\n")
    cause = failure_cause(log)
    assert cause and cause.startswith("the model server at 192.0.2.2:10743 stopped answering")
    log.write_text("(AReaL) RLTrainer ERROR: Training failed with exception: CUDA out of memory\n")
    assert failure_cause(log) is None
    assert failure_cause(tmp_path / "missing.log") is None


def test_the_model_server_watch_stops_a_run_only_when_its_server_is_gone(tmp_path):
    """cua_rl.trainer.model_watch against a real listening server and a port nobody listens on: a live server (even
    one answering 404) never trips it; a refused one does after the grace, and the launcher quotes it."""
    import threading

    from fastapi import FastAPI

    from cua_rl.http.serve import free_port, serve_app_in_thread
    from cua_rl.run.summary import failure_cause
    from cua_rl.trainer.model_watch import GONE, ModelServerWatch

    live = serve_app_in_thread(FastAPI())   # no /health route: a 404 still proves the server is there
    gone, tripped = threading.Event(), []
    try:
        addrs = [f"127.0.0.1:{live.port}"]
        watch = ModelServerWatch(lambda: addrs, interval_s=0.05, grace_s=0.3,
                                 on_gone=lambda why: (tripped.append(why), gone.set())).start()
        assert not gone.wait(1.0), tripped
        addrs.append(f"127.0.0.1:{free_port()}")
        assert gone.wait(5.0)
        watch.stop()
    finally:
        live.stop()
    assert tripped[0].startswith(f"the model server at {addrs[1]} stopped answering")
    log = tmp_path / "train.log"
    log.write_text(f"(AReaL) cua-train ERROR: {GONE.format(addr=addrs[1], seconds=15)}: it exited ...\n")
    assert failure_cause(log).startswith(f"the model server at {addrs[1]} stopped answering")


# --- the whole console of a run, counted -------------------------------------------------------------
# A real 2-step run of this code (train.sh --config examples/cua_agent/config.cpu.yaml on 2 cores, 2026-11-29):
# its train.log (everything the trainer printed: AReaL, vLLM, the rollout worker's per-episode lines, the
# trainer's step lines) and the console train.sh printed, as recorded (not a terminal: plain lines).
RUN_LOG = (Path(__file__).parent / "data" / "cpu_run_2steps_train.log").read_text()
RUN_CONSOLE = (Path(__file__).parent / "data" / "cpu_run_2steps_console.txt").read_text().splitlines()
SECONDS = re.compile(r" \(\d+ s\)$")


def _trainer_part(console: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(the launcher's lines up to starting the trainer, the trainer's, the rest: the monitor's and the summary)."""
    start = next(i for i, line in enumerate(console) if "starting the trainer" in line) + 1
    end = next(i for i, line in enumerate(console) if "Training Monitor stopped" in line)
    return console[:start], console[start:end], console[end:]


def test_the_recorded_console_is_what_the_filter_makes_of_the_recorded_train_log():
    """The recording is faithful: the real filter turns the run's train.log into the trainer's part of its
    console, line for line (the start-up milestones' seconds aside: they count from when the trainer began)."""
    _, recorded, _ = _trainer_part(RUN_CONSOLE)
    made = [line.rstrip("\n") for line in _run(TrainerConsole(total_steps=2, quiet=True), RUN_LOG)]
    assert [SECONDS.sub("", line) for line in made] == [SECONDS.sub("", line) for line in recorded]
    assert sum("INFO cua_rl." in line for line in RUN_LOG.splitlines()) >= 40, "the per-episode lines are there"


def _sixteen_steps(log: str) -> str:
    """The recorded train.log as a 16-step run: its second step's output (from step 1's line to step 2's)
    repeated for steps 2 to 16."""
    lines = log.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("[cua-rl] step 1/2:"))
    second = next(i for i, line in enumerate(lines) if line.startswith("[cua-rl] step 2/2:"))
    head = [line.replace("step 1/2:", "step 1/16:") for line in lines[:first + 1]]
    steps = [line.replace("step 2/2:", f"step {n}/16:") for n in range(2, 17) for line in lines[first + 1:second + 1]]
    return "".join(head + steps + lines[second + 1:])


def _warm_start_lines(tmp_path, capsys) -> list[str]:
    """What building the SFT warm start prints (cua_rl/sft/warm_start.py) for the default recipe's 128
    demonstrations and 20 steps, from a child printing the SFT's log lines."""
    from cua_rl.sft.warm_start import _run_showing_progress

    child = ("import sys\n"
             "for i in range(1, 129): print(f'2026-11-29 05:40:00,000 cua_rl.sft INFO recorded {i}/128 demonstrations')\n"
             "for i in range(1, 21): print(f'2026-11-29 05:44:00,000 cua_rl.sft INFO SFT step {i}/20: loss 0.5 "
             "(1.0 s a step, 9 s to go)')\n"
             "print('{\"demonstrations\": 128}')\n")
    capsys.readouterr()
    _run_showing_progress([sys.executable, "-c", child], tmp_path / "warm_start.log", None)
    printed = capsys.readouterr().out.splitlines()
    assert printed and all(line.startswith("[cua-rl] ") for line in printed), printed
    return printed


def _fresh_setup_lines() -> int:
    """The lines scripts/setup.sh prints on a fresh machine whose Debian packages are there: one per step
    (tools, pins, environment, packages, bytecode, link) and the environment's path."""
    setup = (Path(__file__).resolve().parents[2] / "scripts" / "setup.sh").read_text()
    return sum(1 for line in setup.splitlines() if re.search(r'\bstep "', line) and not line.lstrip().startswith("#")
               and "Debian" not in line and "font" not in line) + 1


def test_the_default_runs_console_is_at_most_60_lines_for_16_steps_with_set_up_and_verdict(tmp_path, capsys):
    """The recorded run's console with its trainer part as the filter makes it of 16 steps (a health warning
    that trips on every step said once), plus the default recipe's warm start: kept or copied from its pin (one
    line) or built in the run (its start, its progress lines, where it went), plus what the recording lacks: a
    fresh machine's set-up (one line a step) and the verdict (its start, its summary, a line per gated regime,
    its time). Issue 86: at most 60 lines on a fresh machine (the newcomer bench counts a real one). The run of
    2026-11-29 before this filter printed 2,049 lines for 16 steps."""
    from cua_rl.local_gym.curriculum import GATED

    launcher, _, rest = _trainer_part(RUN_CONSOLE)
    trainer = _run(TrainerConsole(total_steps=16, quiet=True), _sixteen_steps(RUN_LOG))
    steps = [line for line in trainer if line.startswith("[cua-rl] step ")]
    assert [line.split(":")[0] for line in steps] == [f"[cua-rl] step {n}/16" for n in range(1, 17)]
    assert sum(line.startswith("[cua-rl] health") for line in trainer) == 2, trainer   # once, and "again at"
    recorded_setup = sum(line.startswith("[setup]") for line in launcher)
    extra = _fresh_setup_lines() - recorded_setup + 3 + len(GATED)
    kept = 1
    built = 2 + len(_warm_start_lines(tmp_path, capsys))
    for warm_start in (kept, built):
        total = len(launcher) + warm_start + len(trainer) + len(rest) + extra
        print(f"console lines for 16 steps, warm start {'kept' if warm_start == kept else 'built'}: {total}")
        assert total <= (60 if warm_start == kept else 80), (total, launcher, trainer, rest)
