"""One schema per setting (issue 81 item 2), gated in the quick tier with ``ast`` (nothing imported), as
scripts/import_graph.py gates the floors: the workflow's sections (cua_rl/workflow/sections.py) declare no
defaults of their own, every field filled from a ``CUAConfig`` whose field holds the setting's default, help and
choices; and on the trainer side the turn limit has exactly one default, ``CUAConfig.max_turns`` (the agent
service's protocol default, ``maxSteps`` of a run request, is the other). Each rule is shown firing on a small
tree written by the test."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = "cua_rl/workflow/sections.py"
# The names a turn limit goes by on the trainer side (the agent service's protocol calls it maxSteps).
TURN_NAMES = {"max_turns", "max_steps", "maxSteps"}
# Not the trainer side: the agent service itself, and the wire types of its protocol (cua_rl/wire/: the run request
# both ends import), whose maxSteps default is the protocol's.
PROTOCOL_SIDE = ("cua_rl/local_agent/", "cua_rl/wire/")


def _is_dataclass(node: ast.ClassDef) -> bool:
    def name(d: ast.expr) -> str:
        d = d.func if isinstance(d, ast.Call) else d
        return d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")
    return any(name(d) == "dataclass" for d in node.decorator_list)


def section_defaults(root: Path) -> list[str]:
    """``Class.field = value`` of every dataclass field with a default (a value or ``field(default...)``) in the
    sections module under ``root``."""
    tree = ast.parse((root / SECTIONS).read_text())
    found = []
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and _is_dataclass(cls):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    found.append(f"{cls.name}.{ast.unparse(stmt.target)} = {ast.unparse(stmt.value)}")
    return found


def _default_of(value: ast.expr | None) -> ast.expr | None:
    """The default a declared value gives, ``field(default=X)`` read as X; None for none (or a literal None: an
    optional limit, "no limit", is not a default of the setting)."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
        value = next((k.value for k in value.keywords if k.arg == "default"), None)
    if value is None or (isinstance(value, ast.Constant) and value.value is None):
        return None
    return value


def _number(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and isinstance(value.value, (int, float)) and not isinstance(value.value,
                                                                                                        bool)


def turn_defaults(root: Path, protocol: bool = False) -> list[str]:
    """``path:line: what`` for every default of a turn limit on the trainer side under ``root`` (``protocol``: on
    the agent protocol's side, ``PROTOCOL_SIDE``, instead): a class field, a
    parameter default, a keyword argument given a number (``EpisodeLimits(max_turns=20)``), a lookup with a
    number to fall back on (``.get("max_turns", 20)``, ``getattr(c, "max_turns", 20)``)."""
    found: list[tuple[int, str]] = []
    for path in sorted((root / "cua_rl").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(PROTOCOL_SIDE) != protocol:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            hits: list[tuple[int, str]] = []
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") in TURN_NAMES:
                hits += [(node.lineno, ast.unparse(node))] if _default_of(node.value) is not None else []
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") in TURN_NAMES for t in node.targets):
                hits += [(node.lineno, ast.unparse(node))] if _number(node.value) else []
            elif isinstance(node, ast.arguments):
                positional = node.posonlyargs + node.args
                pairs = list(zip(positional[len(positional) - len(node.defaults):], node.defaults))
                pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
                hits += [(d.lineno, f"parameter {a.arg}={ast.unparse(d)}") for a, d in pairs
                         if a.arg in TURN_NAMES and _default_of(d) is not None]
            elif isinstance(node, ast.Call):
                hits += [(k.lineno, ast.unparse(k)) for k in node.keywords if k.arg in TURN_NAMES and _number(k.value)]
                named = [a for a in node.args if isinstance(a, ast.Constant) and a.value in TURN_NAMES]
                if named and node.args[-1] is not named[-1] and _number(node.args[-1]):
                    hits.append((node.lineno, ast.unparse(node)))
            found += [(line, f"{rel}:{line}: {text}") for line, text in hits]
    return [text for _, text in sorted(found, key=lambda f: (f[1].split(":", 1)[0], f[0]))]


def test_the_sections_have_no_defaults_of_their_own():
    """Every field of GymTarget, AgentTarget, ModelTarget, EpisodeLimits and MonitorTarget is required: a default
    there was a second default of a setting CUAConfig defines (EpisodeLimits.max_turns = 20 beside
    CUAConfig.max_turns), which a workflow built without the config silently took."""
    found = section_defaults(ROOT)
    assert not found, ("defaults in the workflow's sections (fill them from the config: sections_from(CUAConfig); "
                       "tests: tests/sections.py):\n" + "\n".join(found))


def test_the_trainer_side_has_one_default_of_the_turn_limit():
    found = turn_defaults(ROOT)
    assert len(found) == 1 and found[0].startswith("cua_rl/config.py:"), (
        "the trainer side must have one default of the turn limit, CUAConfig.max_turns; found:\n" + "\n".join(found))


def test_the_agent_protocol_has_one_default_of_the_turn_limit():
    """The other default (issue 81 item 2): maxSteps of a run request, declared once in the wire type both the
    client and our agent service import (issue 87 item 1), never again in the service."""
    found = turn_defaults(ROOT, protocol=True)
    assert len(found) == 1 and found[0].startswith("cua_rl/wire/agent.py:"), (
        "the agent protocol must have one default of maxSteps, in cua_rl/wire/agent.py; found:\n" + "\n".join(found))


def test_the_gates_fire_on_a_default(tmp_path):
    """Each rule finds what it forbids in a small tree (a gate that finds nothing proves nothing)."""
    package = tmp_path / "cua_rl"
    (package / "workflow").mkdir(parents=True)
    (package / "local_agent").mkdir()
    (package / "workflow" / "sections.py").write_text(
        "from dataclasses import dataclass, field\n@dataclass\nclass EpisodeLimits:\n    max_turns: int = 20\n"
        "    extra: dict = field(default_factory=dict)\n    name: str\n")
    (package / "config.py").write_text("class C:\n    max_turns: int = field(default=20)\n"
                                       "    max_steps: int | None = None\n")
    (package / "workflow" / "group.py").write_text(
        "def f(a, max_turns=20, *, max_steps: int | None = None):\n    return g(max_turns=3, other=4)\n"
        "x = d.get('max_turns', 20) or getattr(c, 'max_turns', 5) or d.get('max_turns')\n")
    (package / "local_agent" / "schema.py").write_text("class R:\n    max_steps: int = 20\n")
    assert section_defaults(tmp_path) == ["EpisodeLimits.max_turns = 20",
                                          "EpisodeLimits.extra = field(default_factory=dict)"]
    found = turn_defaults(tmp_path)
    assert [f.split(": ", 1)[0] for f in found] == [
        "cua_rl/config.py:2", "cua_rl/workflow/group.py:1", "cua_rl/workflow/group.py:2", "cua_rl/workflow/group.py:3",
        "cua_rl/workflow/group.py:3", "cua_rl/workflow/sections.py:4"], found
    assert turn_defaults(tmp_path, protocol=True) == ["cua_rl/local_agent/schema.py:2: max_steps: int = 20"]
