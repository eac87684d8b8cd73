"""Keep the stdlib logging tree intact when AReaL is imported.

Why: ``areal.utils.logging.getLogger`` (1.0.4) installs a *new* ``RootLogger`` and ``Manager`` on every
call (to undo transformer_engine's config). Every ``logging.getLogger(__name__)`` made afterwards hangs
off that detached WARNING-level root, which has no handlers: our INFO lines vanish even after
``logging.basicConfig`` and WARNINGs only reach Python's last-resort stderr handler. ``keep_stdlib_logging``
wraps AReaL's function so that, after it has configured its own loggers (which carry their own
handlers), the process-wide root and manager are put back. Call it once, early, in every entry point
that imports areal (train.py, the launcher); it is idempotent.
"""

from __future__ import annotations

import functools
import logging
import sys

_INSTALLED_FLAG = "_cua_keeps_stdlib_root"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Loggers whose INFO lines a quiet console still shows: the launcher's own decisions and progress.
CONSOLE_INFO = ("cua_rl.run.launch", "cua_rl.sft", "cua_rl.local_model")


def keep_stdlib_logging() -> bool:
    """Patch ``areal.utils.logging.getLogger``; returns False when areal is not installed."""
    try:
        from areal.utils import logging as areal_logging
    except ImportError:
        return False
    original = areal_logging.getLogger
    if getattr(original, _INSTALLED_FLAG, False):
        return True
    root, manager = logging.root, logging.Logger.manager
    if manager.root is not root:  # areal already swapped them: find the interpreter's own manager
        import asyncio.log  # its logger is made by the first manager whenever asyncio came before areal

        manager = asyncio.log.logger.manager if asyncio.log.logger.manager.root is root else logging.Manager(root)
    logging.Logger.root, logging.Logger.manager = root, manager

    @functools.wraps(original)
    def get_logger(*args, **kwargs):
        result = original(*args, **kwargs)
        logging.Logger.root, logging.Logger.manager = root, manager
        return result

    setattr(get_logger, _INSTALLED_FLAG, True)
    areal_logging.getLogger = get_logger
    return True


def setup_logging(level: int = logging.INFO, *, areal: bool = True) -> None:
    """The console logging of our entry points (train.py, the launcher, the servers' CLIs).

    ``areal=False`` for processes that never import AReaL (the gym's and the agent service's CLIs):
    installing the patch imports AReaL, i.e. torch and transformers (tens of seconds, ~1 GiB resident).
    """
    if areal:
        keep_stdlib_logging()
    logging.basicConfig(level=level, format=FORMAT)
    # httpx logs every request at INFO: thousands of screenshot/action lines per training step.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # transformers logs every file it saves or loads at INFO (processor configs, chat templates).
    logging.getLogger("transformers").setLevel(logging.WARNING)


def worker_logging(level: int = logging.INFO) -> None:
    """Our INFO lines in a process nobody configured logging in: AReaL's rollout worker, whose output is
    the run's rollout.log (where the policy endpoint says where it listens and each episode's gym, agent
    and reward lines belong). Does nothing where the root logger has handlers (our entry points, pytest).

    The worker imports our modules in no order of ours (unpickling the workflow's arguments imports
    ``cua_rl.policy`` before anything could call ``keep_stdlib_logging``), so module loggers made while AReaL's
    detached root was in place are made again here, on the mended tree."""
    keep_stdlib_logging()
    ours = logging.getLogger("cua_rl")
    if logging.getLogger().handlers or ours.handlers:
        return
    for name, module in list(sys.modules.items()):
        found = getattr(module, "logger", None) if name.split(".")[0] == "cua_rl" else None
        if isinstance(found, logging.Logger) and found.manager is not logging.Logger.manager:
            module.logger = logging.getLogger(found.name)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    ours.addHandler(handler)
    ours.setLevel(level)
    ours.propagate = False


def _console_worthy(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.name.startswith(CONSOLE_INFO)


def log_to_file(path, quiet_console: bool = True) -> None:
    """Everything at INFO also goes to ``path``; with ``quiet_console`` the console keeps only WARNING and
    above plus the launcher's own INFO lines (``CONSOLE_INFO``): the embedded gym and agent service log a
    line per execution and run, which belongs in the file."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.setLevel(logging.INFO)
    if quiet_console:
        for h in root.handlers:
            if type(h) is logging.StreamHandler:
                h.addFilter(_console_worthy)
    root.addHandler(handler)
