"""Each setting of ours carries its help (and, for a closed set, its choices) in its field, and everything that
shows a setting's help reads it from there: ``train.sh --help`` and docs/settings.md. Read with ``ast`` (quick
tier: nothing imported), as scripts/import_graph.py gates the floors."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from cua_rl.run import cli, settings_help

ROOT = Path(__file__).resolve().parents[2]


def _words(text: str) -> int:
    return len(re.findall(r"[A-Za-z][A-Za-z'-]*", text))


def test_every_setting_of_ours_carries_its_help_in_its_field():
    """Every field of CUAConfig that AReaL's GRPOConfig lacks, and every field of our sections: a help of at least
    three words that is not just the field's name; a closed set's choices are a list of strings."""
    classes = settings_help.own_classes()
    assert {"CUAConfig", "TrajectoryConfig", "HealthConfig", "EndpointSettings", "EmbeddedStackConfig",
            "TreeConfig", "SFTConfig", "VerdictConfig", "GymFleetConfig", "RayGymsConfig", "TaskSourceConfig",
            "CUAvLLMConfig"} <= set(classes), classes
    missing, counted = [], 0
    for name in classes:
        for field_name in settings_help.own_fields(name):
            counted += 1
            s = settings_help.setting(field_name, name)
            text = s.help if s else ""
            if _words(text) < 3 or text.strip(" .").lower() == field_name.replace("_", " "):
                missing.append(f"{name}.{field_name}: {text!r}")
    assert counted >= 110, counted
    assert not missing, "fields without a help of their own (field(metadata={'help': ...})):\n" + "\n".join(missing)


def test_declared_choices_are_what_the_checks_accept():
    """A field's ``choices`` name the same constant its check uses (or list the values themselves): each declared
    choice loads, and a value outside them is refused when the config loads."""
    from cua_rl.config import CUAConfig

    for key in ("gym_split_type", "existing_run", "agent_service", "embedded.gym_id", "trajectory.export_style",
                "trajectory.group_weight", "health.on_anomaly", "task_source.kind"):
        s = settings_help.setting(key)
        assert s is not None and len(s.choices) >= 2, key
    for key in ("gym_split_type", "agent_service", "trajectory.group_weight", "health.on_anomaly"):
        section, _, name = key.rpartition(".")
        for value in settings_help.setting(key).choices:
            kwargs = {name: value} if not section else {}
            if section:
                from cua_rl.trainer.health import HealthConfig
                from cua_rl.trajectory.config import TrajectoryConfig

                cls = {"trajectory": TrajectoryConfig, "health": HealthConfig}[section]
                cls(**{name: value})
            else:
                CUAConfig(**kwargs)


def test_each_flag_shows_the_help_of_the_field_it_sets():
    """``train.sh --help`` answers without importing AReaL, and each flag that sets a key shows that field's help,
    read from the field."""
    for flag in cli.FLAGS:
        text = cli.flag_help(flag)
        assert _words(text) >= 3, flag.name
        if flag.keys:
            field_help = settings_help.help_of(flag.keys[0])
            assert field_help and text.startswith(field_help), flag.name
    out = subprocess.run([sys.executable, "-c", "import sys; from cua_rl.run import cli; cli.print_help(); "
                          "assert 'areal' not in sys.modules, 'the help imported AReaL'"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    flat = " ".join(out.stdout.split())
    assert " ".join(settings_help.help_of("max_turns").split()) in flat


def test_the_settings_page_is_written_from_the_fields():
    """docs/settings.md is ``python -m cua_rl.run.settings_help``'s output, byte for byte."""
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == settings_help.markdown(), "docs/settings.md is stale: python -m cua_rl.run.settings_help > docs/settings.md"
    tree_fields = [n.target.id for n in ast.walk(ast.parse((ROOT / "cua_rl" / "config.py").read_text()))
                   if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    assert "`max_turns`" in page and len(tree_fields) > 60


def test_every_parameter_named_config_is_annotated():
    """A room is handed its typed section or, at the top, the whole ``CUAConfig``; AReaL's config class below
    ``cua_rl.config``: an untyped ``config`` hid which fields a room read (the review's six hidden arrows)."""
    untyped = []
    for path in sorted((ROOT / "cua_rl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                untyped += [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
                            for a in node.args.args + node.args.kwonlyargs if a.arg == "config" and a.annotation is None]
    assert not untyped, untyped
