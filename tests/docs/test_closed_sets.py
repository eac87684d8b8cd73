"""Closed sets inside the code are Enums, one definition each (issue 81 item 5): a dropped episode's cause
(``cua_rl.runs.DropCause``), an agent run's state and whose failure a failed run was
(``cua_rl.mini_agent.states``). ``StrEnum``, so the values on the wire and on disk stay the strings they were.
Config fields stay strings with ``choices`` (OmegaConf maps Enums by member name; ``qwen3-vl`` is no name).
The AST gate finds any code that still names one of these values as a bare string where it makes or compares
one; it is shown firing on a small tree written by the test."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from cua_rl.mini_agent.states import RunFailure, RunState
from cua_rl.runs import DropCause
from cua_rl.workflow import Dropped

ROOT = Path(__file__).resolve().parents[2]
# Where a value is read or written: the attribute or key that holds it -> the set it belongs to.
HOLDERS = {"cause": DropCause, "failure": RunFailure, "status": RunState, "kind": RunFailure}
# What makes one: the callable -> (the set, the positional argument that is the value).
MAKERS = {"Dropped": (DropCause, 0), "RunFailed": (RunFailure, 1)}
# Keyword arguments that are one (``status=`` is left out: a monitor record's status is another set).
KEYWORDS = {"cause": DropCause, "failure": RunFailure, "kind": RunFailure}
# The agent service's wire types keep the client's tolerant sets (other agent services send other words); the
# monitor's record states are another set (a rollout's, written by the reporter).
SKIP = ("cua_rl/mini_agent/models.py", "cua_rl/local_agent/schema.py", "cua_rl/monitor/")


def _holder(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return ""


def _bare(node: ast.expr, closed) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in {m.value for m in closed}


def bare_values(root: Path) -> list[str]:
    """``path:line: code`` wherever a value of a closed set is a bare string: compared with what holds one
    (``r.cause == "gym"``), given to what makes one (``Dropped("gym", ...)``, ``RunFailed(why, "env")``), or
    passed by keyword (``failure="model"``)."""
    found = []
    for path in sorted((root / "cua_rl").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(SKIP):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            hit = False
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                for holder in filter(None, map(_holder, sides)):
                    closed = HOLDERS.get(holder)
                    hit |= closed is not None and any(_bare(s, closed) for s in sides)
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                closed, at = MAKERS.get(name, (None, 0))
                hit = closed is not None and len(node.args) > at and _bare(node.args[at], closed)
                hit |= any(k.arg in KEYWORDS and _bare(k.value, KEYWORDS[k.arg]) for k in node.keywords)
            if hit:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_closed_value_is_a_bare_string():
    found = bare_values(ROOT)
    assert not found, ("values of a closed set written as bare strings (use DropCause / RunState / RunFailure):\n"
                       + "\n".join(found))


def test_the_gate_fires_on_a_bare_value(tmp_path):
    (tmp_path / "cua_rl").mkdir()
    (tmp_path / "cua_rl" / "a.py").write_text(
        'x = r.cause == "gym"\ny = Dropped("crash", "why")\nz = RunFailed(why, "env")\n'
        'rec.finish(False, "r", failure="model")\nok = final["status"] == "completed"\n'
        'fine = Dropped(DropCause.GYM, "gym") or r.name == "gym" or f(status="done")\n')
    assert [f.split(": ", 1)[0] for f in bare_values(tmp_path)] == [f"cua_rl/a.py:{n}" for n in range(1, 6)]


def test_the_wire_values_stay_the_strings_they_were():
    """A member is its value: in JSON, in a counts key, compared with what another service sends."""
    assert [c.value for c in DropCause] == ["gym", "agent_service", "model_server", "policy_unreached", "crash"]
    assert [s.value for s in RunState] == ["running", "completed", "failed", "cancelled"]
    assert [f.value for f in RunFailure] == ["env", "model", "policy"]
    assert json.dumps({DropCause.POLICY_UNREACHED: RunFailure.ENV}) == '{"policy_unreached": "env"}'
    assert f"episodes_lost_{DropCause.AGENT_SERVICE}" == "episodes_lost_agent_service"
    assert {RunFailure.ENV: DropCause.GYM}["env"] is DropCause.GYM    # a string from the wire finds its member


def test_a_drop_takes_a_cause_of_the_set_and_refuses_another():
    assert Dropped("gym", "create failed").cause is DropCause.GYM
    with pytest.raises(ValueError, match="unknown cause 'network'"):
        Dropped("network", "a cause nobody counts")
