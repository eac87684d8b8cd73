"""The benches as modules, for tests that check what a bench computes (its statistic, its bar, its writer): one
loader, since ``bench/`` is a folder of scripts and not a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` loaded as the module ``name`` (run at import, as ``python bench/<name>.py`` would)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
