"""Shared fixtures of the policy tests: the tiny offline Qwen3-VL (engineer D's builder) and screenshots."""

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from cua_rl.local_model import build_tiny

    return str(build_tiny(tmp_path_factory.mktemp("tiny-qwen3-vl"), seed=0))


@pytest.fixture(scope="session")
def processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)
