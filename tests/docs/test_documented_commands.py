"""Every command the docs give for our programs runs, in the form that starts nothing: the launcher's (``train.sh``,
``cua-train``) with ``--dry-run``, which loads and checks the config the command would run; AReaL's native form
(``python -m cua_rl.train``/``cua_rl.sft --config FILE ...``) by loading its config; every other program of ours
(``cua-gym``, ``cua-agent``, ``cua-monitor``, ``cua-model``, ``cua-eval``, ``python -m cua_rl...``, ``python
bench/*.py``, ``python -m bench.*``) with ``--help`` (of its subcommand, if it names one). Each must exit 0.

Commands come from README.md, examples/cua_agent/README.md and docs/*.md: shell code blocks (a line ending in
``\\`` continues) and code spans, as tests/docs/test_docs_match_code.py reads them. Placeholders (``URL``,
``DIR``, ``FILE``, ``<logs>``, ``[optional ...]``, ``...``) become real values or are left out. The review of
2026-11-29 found documented commands that ran the wrong recipe (``train.sh embedded.tasks_dir=DIR`` on a CPU
machine) or failed (``python bench/health_bench.py``: ImportError; ``embedded.start_monitor=false``: "use +").
The distinct ``--help`` forms run in parallel, the dry-runs in this process (AReaL imported once): slow tier.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from doc_snippets import NOT_SHELL, REPO, Snippet, all_snippets

LAUNCHER = re.compile(r"^(?:\./examples/cua_agent/train\.sh|examples/cua_agent/train\.sh|train\.sh|cua-train|"
                      r"python3? -m cua_rl\.run\.launch)(?=\s|$)")
NATIVE = re.compile(r"^python3? -m cua_rl\.(train|sft)(?=\s|$)")
HELP = re.compile(r"^(?:(cua-(?:gym|agent|monitor|model|eval))|python3? -m (cua_rl(?:\.\w+)+|bench\.\w+)|"
                  r"python3? (bench/\w+\.py))(?=\s|$)")
WITH_SUBCOMMANDS = {"cua-gym", "cua-agent", "cua-monitor", "cua-model", "cua_rl.local_gym", "cua_rl.local_agent",
                    "cua_rl.monitor", "cua_rl.local_model"}
# Not commands a user runs: what AReaL's scheduler starts, the launcher's hand-over to the trainer it prewarmed.
NOT_USER_COMMANDS = ("cua_rl.areal_ext.worker", "--from-launcher")


def documented_commands() -> list[tuple[Snippet, str]]:
    """(where, command) for every code-block line (continuations joined) and code span that starts with one of
    our programs."""
    found, pending = [], None
    for s in all_snippets():
        if s.kind == "block" and s.lang not in NOT_SHELL:
            text = s.text.strip()
            pending = (pending[0], pending[1] + " " + text) if pending else (s, text)
            if text.endswith("\\"):
                pending = (pending[0], pending[1][:-1])
                continue
            found.append(pending)
            pending = None
        elif s.kind == "span":
            found.append((s, s.text.strip()))
    out = []
    for s, text in found:
        text = re.sub(r"\s+#.*$", "", text).strip()
        for part in re.split(r"\s*(?:&&|;|\|)\s*", text):
            if LAUNCHER.match(part) or NATIVE.match(part) or HELP.match(part):
                if not any(n in part for n in NOT_USER_COMMANDS):
                    out.append((s, part))
    return out


def _words(command: str, tmp: Path) -> list[str]:
    """The command's arguments with the docs' placeholders made real or left out (optional parts such as
    ``[--seed 0]`` or ``[trial_name=NAME]``, and ``...``)."""
    words, optional = [], False
    for word in shlex.split(command.replace("…", "...")):
        if word.startswith("[") and not optional:
            optional = True
        if optional:
            optional = not word.endswith("]")
            continue
        if word == "..." or word.endswith("..."):
            continue
        word = (word.replace("<logs>", str(tmp)).replace("~/keyboard-tasks", str(tmp))
                .replace("<double>", "http://127.0.0.1:9"))
        word = re.sub(r"\b(?:DIR|OUT_DIR|CKPT)\b", str(tmp), word)
        word = re.sub(r"\bURL\b", "http://127.0.0.1:9", word)
        word = re.sub(r"\b(?:FILE|CFG|CONFIG)\b", str(REPO / "examples/cua_agent/config.cpu.yaml"), word)
        words.append(word)
    return words


# Our console scripts as the modules they run: this checkout's code (the environment's scripts run whichever clone
# set-up linked last).
SCRIPTS = {"cua-gym": "cua_rl.local_gym", "cua-agent": "cua_rl.local_agent", "cua-monitor": "cua_rl.monitor",
           "cua-model": "cua_rl.local_model", "cua-eval": "cua_rl.evaluate"}


def _help_form(command: str) -> tuple[str, ...]:
    """The program (and its subcommand) of ``command`` with ``--help``."""
    m = HELP.match(command)
    prog = SCRIPTS.get(m.group(1)) or m.group(2) or m.group(3)
    argv = [sys.executable, "-m", prog] if not m.group(3) else [sys.executable, str(REPO / prog)]
    rest = command[m.end():].split()
    if prog in WITH_SUBCOMMANDS and rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
        argv.append(rest[0])
    return (*argv, "--help")


@pytest.mark.timeout(900)
def test_every_documented_command_of_ours_runs_in_its_dry_run_or_help_form(tmp_path, launcher):
    commands = documented_commands()
    launcher_forms = {(s, c) for s, c in commands if LAUNCHER.match(c)}
    native = {(s, c) for s, c in commands if NATIVE.match(c)}
    helps: dict[tuple[str, ...], list[str]] = {}
    for s, c in commands:
        if HELP.match(c) and not NATIVE.match(c) and not LAUNCHER.match(c):
            helps.setdefault(_help_form(c), []).append(s.where())
    assert len(launcher_forms) >= 15 and len(native) >= 3 and len(helps) >= 15, (len(launcher_forms), len(native), len(helps))
    problems = []

    def run_help(argv: tuple[str, ...]) -> tuple[tuple[str, ...], subprocess.CompletedProcess]:
        # generous: two benches import AReaL before their parser (about 45 s each on a busy 2-core machine, several
        # minutes when other heavy work shares it)
        return argv, subprocess.run(list(argv), cwd=REPO, capture_output=True, text=True, timeout=480)

    dry_runs: dict[tuple[str, ...], list[str]] = {}
    for s, command in launcher_forms:
        args = tuple(a for a in _words(command[LAUNCHER.match(command).end():], tmp_path) if a != "--dry-run")
        if "--help" not in args:   # the flags' help: tests/run/test_cli.py
            dry_runs.setdefault(args, []).append(f"{s.where()}: {command!r}")
    with ThreadPoolExecutor(max_workers=2) as pool:
        running = pool.map(run_help, sorted(helps))
        # meanwhile, in this process: each distinct launcher command's dry-run, then the native form's config
        for args, where in sorted(dry_runs.items()):
            rc, _, _, out = launcher(list(args))
            if rc != 0:
                problems.append(f"{where[0]} --dry-run exits {rc}: {out.err.strip()[-400:]}")
        from cua_rl.run.launch import ConfigError, load_config

        for s, command in sorted(native, key=lambda p: p[0].where()):
            args = _words(command[NATIVE.match(command).end():], tmp_path)
            config = next((args[i + 1] for i, a in enumerate(args) if a == "--config" and i + 1 < len(args)), None)
            if config is None:
                continue   # named, not given (e.g. "AReaL's native form, python -m cua_rl.train")
            try:
                load_config(str(REPO / config) if not Path(config).is_absolute() else config,
                            [a for a in args if "=" in a and not a.startswith("-")])
            except ConfigError as exc:
                problems.append(f"{s.where()}: {command!r}: its config does not load: {exc}")
        for argv, proc in running:
            if proc.returncode != 0:
                problems.append(f"{', '.join(helps[argv])}: {' '.join(argv)} exits {proc.returncode}: "
                                f"{(proc.stdout + proc.stderr).strip()[-400:]}")
    assert not problems, "\n".join(problems)
