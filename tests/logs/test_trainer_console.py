"""cua_rl.console.TrainerConsole on a real AReaL 1.0.4 step: the output of one GRPO step of a CPU run
(data/areal_step_output.txt, copied from a launcher console) becomes one progress line; the rest passes."""

from pathlib import Path

from cua_rl.console import TrainerConsole

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


def test_two_steps_and_a_table_at_the_very_end():
    second = STEP.replace("Train step 1/1000", "Train step 2/1000").splitlines(keepends=True)
    end = next(i for i, line in enumerate(second) if "╘" in line)   # the output stops inside the table
    out = _run(TrainerConsole(), STEP + "".join(second[:end]))
    steps = [line.split(":")[0] for line in out if line.startswith("[cua-rl] step")]
    assert steps == ["[cua-rl] step 1", "[cua-rl] step 2"], "the last table is flushed by close()"


def test_lines_with_box_characters_outside_a_step_pass_through():
    line = "│ a user's own table │ 1 │\n"
    assert TrainerConsole().feed(line) == [line]
