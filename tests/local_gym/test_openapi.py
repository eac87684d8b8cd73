"""The gym's ``/openapi.json`` publishes its request bodies as typed models (cua_rl/local_gym/bodies.py, issue 84):
the contract a user's own gym implements. The routes keep parsing the bodies themselves (the bad-input corpus,
tests/bad_input/test_gym_bad_input.py, holds them to their statuses and messages); this checks what is published:
every state-changing route names its body's schema, and the schema takes docs/protocols.md's examples and refuses
what the gym refuses."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from cua_rl.local_gym import start_gym_server
from cua_rl.local_gym.bodies import ActionBody, CreateBody, EvaluateBody, ForkBody

DOC_ACTIONS = [{"type": "click", "x": 0.5, "y": 0.25}, {"type": "key", "keys": ["ctrl", "s"]},
               {"type": "type", "text": "hello\n"}, {"type": "scroll", "x": 0.5, "y": 0.5, "dy": 3},
               {"type": "tap", "x_norm": 0.1, "y_norm": 0.9}, {"type": "drag", "x": 0.1, "y": 0.1, "x2": 0.9, "y2": 0.9},
               {"type": "wait", "ms": 0}, {"type": "key", "key": "back"}, {"type": "move", "x": 1, "y": 0}]
BAD_ACTIONS = [{"type": "fly"}, {"type": "click", "x": 1.5, "y": 0.5}, {"type": "click", "x": "a", "y": 0},
               {"type": "type", "text": "x" * 4001}, {"type": "scroll", "x": 0, "y": 0, "dy": 51},
               {"type": "wait", "ms": 10001}, {"x": 0.5, "y": 0.5}]


def test_the_gym_publishes_its_request_bodies():
    with start_gym_server(port=0, pool_size=0, x_spares=0) as gym:
        schema = httpx.get(gym.url + "/openapi.json").json()
    paths, components = schema["paths"], schema["components"]["schemas"]
    for path, model in [("/api/v1/{gym_id}/tasks/{task_id}", CreateBody),
                        ("/api/v1/{gym_id}/executions/{eid}/actions", ActionBody),
                        ("/api/v1/{gym_id}/executions/{eid}/evaluate", EvaluateBody),
                        ("/api/v1/{gym_id}/executions/{eid}/fork", ForkBody)]:
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model.__name__}"}, path
        assert model.__name__ in components
    mapping = components["ActionBody"]["properties"]["action"]["discriminator"]["mapping"]
    assert set(mapping) == {"click", "double_click", "move", "drag", "scroll", "type", "key", "wait", "tap",
                            "long_press", "swipe"}
    assert all(ref.split("/")[-1] in components for ref in mapping.values())


@pytest.mark.parametrize("action", DOC_ACTIONS)
def test_the_documented_actions_fit_the_schema(action):
    ActionBody.model_validate({"action": action})


@pytest.mark.parametrize("action", BAD_ACTIONS)
def test_what_the_gym_refuses_the_schema_refuses(action):
    with pytest.raises(ValidationError):
        ActionBody.model_validate({"action": action})


def test_create_evaluate_and_fork_bodies():
    CreateBody.model_validate({})
    CreateBody.model_validate({"options": {"seed": 7}})
    for bad in ({"options": {"seed": -1}}, {"options": {"seed": 2**53}}, {"options": {"seed": "7"}}):
        with pytest.raises(ValidationError):
            CreateBody.model_validate(bad)
    EvaluateBody.model_validate({"answer_text": "x", "execution_data": {"task_success": True}})
    ForkBody.model_validate({"count": 16})
    for bad in ({"count": 0}, {"count": 17}, {"count": 2, "other": 1}):
        with pytest.raises(ValidationError):
            ForkBody.model_validate(bad)
