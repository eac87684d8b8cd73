"""The gym's request bodies as typed (pydantic) models, published in the gym's ``/openapi.json``: the contract a
user's own gym implements (docs/protocols.md §1.3-1.9), readable by any OpenAPI tool.

Why published, not parsed, by these models: the gym checks its bodies by hand (``env.py``, ``actions.py``,
``fork.py``) with the statuses and messages that tests/bad_input/test_gym_bad_input.py holds it to: a ``null``
create body is a 422 saying so, ``type`` text over 4000 characters a 413, a bare action object is accepted, a
key name is checked against the X keysyms. FastAPI's own validation of a pydantic parameter would answer every
one of those with its generic 422 list, earlier and differently. So the routes keep their parsing, and
``publish(app)`` declares these models as their request bodies (``openapi_extra``) and their schemas under
``components``. tests/local_gym/test_api.py checks that the schema names every body and that the documented
examples validate against it.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

MAX_SEED = 2**53 - 1
Fraction = Annotated[float, Field(ge=0.0, le=1.0, description="a fraction of the screen, 0..1 from the top-left")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)   # "7" is no seed, "0.5" no coordinate, as in the gym


class CreateOptions(_Body):
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = Field(
        None, description="one seed for a whole GRPO group: a generating gym shows all of them the same instance")


class CreateBody(_Body):
    """``POST tasks/{task_id}``: ``{}`` (or no body) or ``{"options": {"seed": N}}``; ``null`` is refused."""
    options: CreateOptions | None = None


class _Point(_Body):
    x: Fraction
    y: Fraction


class Click(_Point):
    type: Literal["click"]
    button: Literal["left", "middle", "right"] = "left"
    count: Annotated[int, Field(ge=1, le=3)] = 1


class DoubleClick(_Point):
    type: Literal["double_click"]


class Move(_Point):
    type: Literal["move"]


class Drag(_Point):
    type: Literal["drag"]
    x2: Fraction
    y2: Fraction


class Scroll(_Point):
    type: Literal["scroll"]
    dx: Annotated[int, Field(ge=-50, le=50)] = 0
    dy: Annotated[int, Field(ge=-50, le=50, description="> 0 scrolls the content down")] = 0


class TypeText(_Body):
    type: Literal["type"]
    text: Annotated[str, Field(max_length=4000, description="\\n and \\t allowed, no other control characters")]


class Key(_Body):
    """A chord (``keys``: 1 to 6 key names, or one ``"ctrl+s"`` string); the mobile alias sends ``key``
    (``back``, ``home``, ``menu``, ``enter``)."""
    type: Literal["key"]
    keys: list[str] | str | None = None
    key: str | None = None


class Wait(_Body):
    type: Literal["wait"]
    ms: Annotated[int, Field(ge=0, le=10000)] = 500


class Tap(_Body):
    """Mobile alias of a left click (``x_norm``/``y_norm`` are read too)."""
    type: Literal["tap"]
    x: Fraction | None = None
    y: Fraction | None = None


class LongPress(_Body):
    type: Literal["long_press"]
    x: Fraction | None = None
    y: Fraction | None = None
    duration_ms: Annotated[int, Field(ge=0, le=10000)] = 800


class Swipe(_Body):
    type: Literal["swipe"]
    x: Fraction | None = None
    y: Fraction | None = None
    x2: Fraction | None = None
    y2: Fraction | None = None


Action = Annotated[Union[Click, DoubleClick, Move, Drag, Scroll, TypeText, Key, Wait, Tap, LongPress, Swipe],
                   Field(discriminator="type")]


class ActionBody(BaseModel):
    """``POST executions/{eid}/actions``: ``{"action": {...}}`` (our gym also takes the bare action)."""
    model_config = ConfigDict(strict=True)
    action: Action


class EvaluateBody(_Body):
    """``POST executions/{eid}/evaluate``: the agent's answer and the run's summary (both optional)."""
    answer_text: str | None = None
    execution_data: dict | None = None


class ForkBody(BaseModel):
    """``POST executions/{eid}/fork`` (our extension): ``{"count": N}``, no body meaning one."""
    model_config = ConfigDict(extra="forbid", strict=True)
    count: Annotated[int, Field(ge=1, le=16)] = 1


BODIES: dict[str, type[BaseModel]] = {"create": CreateBody, "act": ActionBody, "evaluate": EvaluateBody,
                                      "fork": ForkBody}
REF = "#/components/schemas/{model}"


def body_spec(model: type[BaseModel], required: bool = False) -> dict:
    """A route's ``openapi_extra``: ``model`` as its JSON request body."""
    return {"requestBody": {"required": required, "content": {
        "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}}


def publish(app: FastAPI) -> None:
    """Add the schemas of ``BODIES`` (and the models they use) to ``app``'s OpenAPI ``components``."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        found = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in BODIES.values():
            spec = model.model_json_schema(ref_template=REF)
            found.update(spec.pop("$defs", {}))
            found[model.__name__] = spec
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
