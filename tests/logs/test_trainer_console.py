"""cua_rl.run.console.TrainerConsole on a real AReaL 1.0.4 step: the output of one GRPO step of a CPU run
(data/areal_step_output.txt, copied from a launcher console) becomes one progress line; the rest passes."""

from pathlib import Path

from cua_rl.run.console import TrainerConsole

STEP = (Path(__file__).parent / "data" / "areal_step_output.txt").read_text()


def _run(console: TrainerConsole, text: str) -> list[str]:
    out = []
    for line in text.splitlines(keepends=True):
        out += console.feed(line)
    return out + console.close()


def test_statistics_table_becomes_one_progress_line():
    out = _run(TrainerConsole(total_steps=20, log_file="/runs/x/train.log"), STEP)
    progress = [line for line in out if line.startswith("[cua-rl] step")]
    assert progress == [progress[0]] and progress[0].startswith("[cua-rl] step 1/20: reward 0.562, success 0.562")
    assert "~16 episodes (32 rows)" in progress[0] and "train 44.6 s" in progress[0]
    assert any("/runs/x/train.log" in line for line in out), "the console must say where the table went"
    assert not any("│" in line or "╒" in line or "Stats (1/1)" in line or "Train step 1/1000" in line for line in out)
    # every line that is not the table or its header passes through unchanged, in order
    kept = [line for line in STEP.splitlines(keepends=True)
            if "│" not in line and "╒" not in line and "├" not in line and "╘" not in line
            and "StatsLogger" not in line]
    assert [line for line in out if not line.startswith("[cua-rl]")] == kept
    assert out.index(progress[0]) < out.index(kept[-1]), "the progress line comes where the table was"


def test_episodes_are_counted_by_rows_per_episode_when_episodes_train_as_one_row():
    """With ``trajectory.export_style: concat`` an episode is one row: the workflow's ``rows_per_episode``
    counts episodes, not ``num_turns``."""
    line = TrainerConsole.progress_line(3, 16, {"rollout/reward": 0.5, "ppo_actor/n_seqs": 16.0,
                                                "rollout/num_turns": 4.5, "rollout/rows_per_episode": 1.0}, 40.0)
    assert "~16 episodes (16 rows)" in line


def test_two_steps_and_a_table_at_the_very_end():
    second = STEP.replace("Train step 1/1000", "Train step 2/1000").splitlines(keepends=True)
    end = next(i for i, line in enumerate(second) if "╘" in line)   # the output stops inside the table
    out = _run(TrainerConsole(), STEP + "".join(second[:end]))
    steps = [line.split(":")[0] for line in out if line.startswith("[cua-rl] step")]
    assert steps == ["[cua-rl] step 1", "[cua-rl] step 2"], "the last table is flushed by close()"


def test_lines_with_box_characters_outside_a_step_pass_through():
    line = "│ a user's own table │ 1 │\n"
    assert TrainerConsole().feed(line) == [line]


# --- quiet (the launcher's default) ----------------------------------------------------------------
START = (Path(__file__).parent / "data" / "cpu_run_start.txt").read_text()   # train.log of a default CPU run:
# AReaL's and vLLM's start-up, the rollout workers' notes and the first two steps (450 lines)


def test_quiet_console_shows_progress_milestones_and_our_lines_only():
    out = _run(TrainerConsole(total_steps=24, log_file="/runs/x/train.log", quiet=True), START)
    assert len(out) <= 12, out
    progress = [line for line in out if line.startswith("[cua-rl] step")]
    assert [p.split(":")[0] for p in progress] == ["[cua-rl] step 1/24", "[cua-rl] step 2/24"]
    milestones = [line.split(" (")[0] for line in out if line.startswith("[cua-rl]") and "step" not in line
                  and "statistics" not in line]
    assert milestones == ["[cua-rl] training engine ready", "[cua-rl] vLLM starting",
                          "[cua-rl] vLLM serving at http://192.0.2.2:10743",
                          "[cua-rl] inference engine ready; rollouts begin"]
    others = [line for line in out if not line.startswith("[cua-rl]")]
    assert others and all(" INFO cua_rl." in line or " cua-train INFO:" in line for line in others), others
    assert any(" cua-train INFO: train tasks:" in line for line in others), "the trainer's own logger shows"
    assert not any("APIServer" in line or "EngineCore" in line or "Writing model shards" in line for line in out)
    assert not any("(AReaL)" in line and " cua-train " not in line for line in out)


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


def test_the_summary_numbers_steps_as_the_console_does():
    from cua_rl.run.summary import by_step

    assert by_step([(0, 0.78125), (1, 0.5), (3, 1.0)]) == "steps 1-4: 0.781 0.500 - 1.000"


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

    from cua_rl.http.serve import free_port, serve_app_in_thread
    from cua_rl.run.summary import failure_cause
    from cua_rl.trainer.model_watch import GONE, ModelServerWatch
    from fastapi import FastAPI

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
