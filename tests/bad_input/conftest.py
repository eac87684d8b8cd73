"""The bad-input corpus folder: prints the per-service totals of ``bad_input_corpus.TALLY`` after the run."""

from bad_input_corpus import TALLY, summary_lines


def pytest_terminal_summary(terminalreporter):
    if TALLY:
        terminalreporter.section("bad-input corpus (tried / 4xx / 5xx / hangs)")
        for line in summary_lines():
            terminalreporter.write_line(line)
