"""The local_model tests use the suite's session-wide tiny model (tests/conftest.py) as a Path."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tiny_model_dir) -> Path:
    return Path(tiny_model_dir)
