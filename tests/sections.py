"""The workflow's sections for a test: every field from a default ``CUAConfig`` (its fields hold each setting's one
default), the test's own values over them. The sections themselves have no defaults (cua_rl/workflow/sections.py;
tests/config/test_one_spine.py), so a test names what it sets and gets the run's defaults for the rest, never
defaults of its own that could drift from the config's."""

from __future__ import annotations

import dataclasses
from typing import Any

SECTIONS = ("model", "gym", "agent", "limits", "monitor")


def sections(**fields: dict) -> dict[str, Any]:
    """Every section ``cua_rl.workflow.sections_from`` builds from ``CUAConfig()``, the given fields replaced:
    ``sections(limits={"max_turns": 4}, agent={"base_url": url})["limits"]``."""
    from cua_rl.config import CUAConfig
    from cua_rl.workflow import sections_from

    unknown = set(fields) - set(SECTIONS)
    if unknown:
        raise TypeError(f"no section {sorted(unknown)}; the sections are {SECTIONS}")
    built = sections_from(CUAConfig())
    return {name: dataclasses.replace(section, **fields.get(name, {})) for name, section in built.items()}


def workflow_args(**kwargs: Any) -> dict[str, Any]:
    """``CUAAgentWorkflow`` keyword arguments: a section given as a dict is fields over the defaults
    (``sections``), one given as itself stands; every other argument passes through."""
    given = {name: kwargs.pop(name) for name in SECTIONS if isinstance(kwargs.get(name), dict)}
    return {**sections(**given), **kwargs}
