"""The policy tests' engine: AReaL's real ``RemotevLLMEngine`` on the session's vLLM server, one per module."""

import pytest
from areal.api.cli_args import InferenceEngineConfig
from areal.engine.vllm_remote import RemotevLLMEngine


@pytest.fixture(scope="module")
def engine(vllm_server):
    eng = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", max_concurrent_rollouts=4, request_timeout=300,
                                                 setup_timeout=60, pause_grace_period=0.5))
    eng.initialize(addr=vllm_server.addr)
    yield eng
    eng.destroy()
