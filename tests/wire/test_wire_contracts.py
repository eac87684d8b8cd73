"""The wire contracts are written once (cua_rl/wire/): the agent service validates the very classes our client
builds, adding validators only, and no two modules under cua_rl/ declare the same JSON field.

Why: the start-run body was written twice (the client's dataclasses, the service's pydantic models) and drifted
one field at a time; three reviews found the twins (issue 87 item 1).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cua_rl
from cua_rl import mini_agent
from cua_rl.local_agent import RunRequest as ServiceRunRequest

PACKAGE = Path(cua_rl.__file__).parent


def _json_names(tree: ast.AST) -> set[str]:
    """The JSON names a module declares: ``Field(alias=...)`` and the keys of dicts built in ``to_payload``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "alias" and isinstance(node.value, ast.Constant):
            names.add(node.value.value)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "to_payload":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Dict):
                    names |= {k.value for k in inner.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return names


def test_no_two_modules_declare_the_same_json_field():
    declared: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _json_names(ast.parse(path.read_text(), str(path))):
            declared.setdefault(name, []).append(str(path.relative_to(PACKAGE.parent)))
    twins = {name: where for name, where in declared.items() if len(where) > 1}
    assert not twins, f"JSON fields declared in more than one module: {twins}"


def test_the_service_validates_the_client_s_classes_adding_no_field():
    assert issubclass(ServiceRunRequest, mini_agent.RunRequest)
    assert ServiceRunRequest.model_fields.keys() == mini_agent.RunRequest.model_fields.keys()
    assert not ServiceRunRequest.__annotations__, "the service's subclass declares fields of its own"
    parts = {name: ServiceRunRequest.model_fields[name].annotation for name in ("model", "env", "start_from")}
    assert parts == {"model": mini_agent.ModelEndpoint, "env": mini_agent.GenvEnv,
                     "start_from": mini_agent.StartFrom | None}


def _request(**fields):
    body = {"task": "t", "agent": "qwen3-vl", "maxSteps": 5,
            "model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "m", "apiKey": "sk-1"},
            "env": {"gymBaseUrl": "http://127.0.0.1:5010", "gymId": "desktop", "executionId": "e1"}}
    body.update(fields)
    return body


def test_what_the_client_sends_the_service_reads_back_unchanged():
    sent = mini_agent.RunRequest(**_request(startFrom={"runId": "r1", "steps": 2, "apiKey": "sk-0"},
                                            sampling={"temperature": 0.7, "seed": 3}),
                                 extra={"historyImages": 2, "stockKnob": True})
    payload = sent.to_payload()
    assert payload["historyImages"] == 2 and payload["stockKnob"] is True
    read = ServiceRunRequest.model_validate(payload)
    assert read.to_payload() == {k: v for k, v in payload.items() if k != "stockKnob"}   # the service ignores it
    assert read.model.api_key.get_secret_value() == "sk-1" and read.sampling.to_body() == {"temperature": 0.7,
                                                                                           "seed": 3}
    assert "sk-" not in str(read.redacted()) and "sk-" not in repr(sent)


@pytest.mark.parametrize("bad, says", [
    ({"maxRunTimeSec": 0}, "maxRunTimeSec"),
    ({"sampling": {"top_p": 0}}, "top_p"),
    ({"env": {"gymBaseUrl": "ftp://x", "gymId": "desktop", "executionId": "e1"}}, "gymBaseUrl"),
    ({"env": {"gymBaseUrl": "http://x", "gymId": "desktop", "executionId": "../e1"}}, "executionId"),
])
def test_both_ends_refuse_a_bad_value_alike(bad, says):
    for side in (mini_agent.RunRequest.model_validate, ServiceRunRequest.model_validate):
        with pytest.raises(ValueError, match=says):
            side(_request(**bad))


def test_only_the_service_knows_its_prompt_formats():
    assert mini_agent.RunRequest.model_validate(_request(agent="a-stock-agents-format")).agent
    with pytest.raises(ValueError, match="unknown agent"):
        ServiceRunRequest.model_validate(_request(agent="a-stock-agents-format"))
