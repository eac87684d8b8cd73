"""AReaL's getLogger must not swallow our log lines. Runs in a subprocess (one areal import): the
patch changes process-wide logging state, which must not leak into the other tests."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import logging, sys
    from areal.utils import logging as areal_logging
    areal_logging.getLogger("areal.before")          # areal swaps the root before we patch
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
    logging.getLogger("cua_rl.early").info("lost-before-patch")   # the problem (AReaL 1.0.4)

    from cua_rl.logs import keep_stdlib_logging
    assert keep_stdlib_logging() and keep_stdlib_logging()        # idempotent
    ours = logging.getLogger("cua_rl.probe")
    areal_logging.getLogger("areal.after")           # areal swaps again: must not orphan us now
    ours.info("ours-info")
    logging.getLogger("cua_rl.probe").info("ours-fresh-lookup")
    areal_logging.getLogger("areal.after").warning("areal-warning")
""")


def test_patch_keeps_our_info_lines_and_areal_logging():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout + result.stderr
    assert "lost-before-patch" not in out
    assert "cua_rl.probe ours-info" in out
    assert "cua_rl.probe ours-fresh-lookup" in out
    assert "areal-warning" in out


QUIET = textwrap.dedent("""
    import logging, sys
    from cua_rl.logs import log_to_file, setup_logging
    setup_logging()                                   # the launcher's console: stderr
    log_to_file(sys.argv[1])
    logging.getLogger("cua_rl.local_gym.manager").info("per-execution line")
    logging.getLogger("cua_rl.local_gym.manager").warning("a desktop failed")
    logging.getLogger("cua_rl.run.launch").info("the launcher decides")
    logging.getLogger("uvicorn.error").info("server started")
""")


def test_launcher_console_keeps_its_own_lines_and_warnings_the_file_keeps_everything(tmp_path):
    log = tmp_path / "launcher.log"
    result = subprocess.run([sys.executable, "-c", QUIET, str(log)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    console = result.stderr
    assert "a desktop failed" in console and "the launcher decides" in console
    assert "per-execution line" not in console and "server started" not in console
    text = log.read_text()
    for line in ("per-execution line", "a desktop failed", "the launcher decides", "server started"):
        assert line in text, line
