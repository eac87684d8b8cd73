"""The policy endpoint: an OpenAI-compatible server in the rollout worker, in front of AReaL's engine.

Surface: ``PolicyEndpoint(engine, processor, tokenizer, gconfig, EndpointSettings(...))``;
``ep = await endpoint.open_episode()`` gives ``ep.base_url`` and ``ep.key`` for the agent and collects
``ep.turns``; ``endpoint.close_episode(ep)`` revokes the key.
"""

from .endpoint import EndpointSettings, PolicyEndpoint, engine_backend, prompt_from_messages, prompt_inputs
from .images import BadImage, ImageFetchLimits
from .prompt import BadRequest
from .records import Episode, Turn, tensor_sha256
from .server import close_loop_servers

__all__ = ["PolicyEndpoint", "EndpointSettings", "engine_backend", "prompt_inputs", "prompt_from_messages", "Episode", "Turn", "tensor_sha256",
           "ImageFetchLimits", "BadImage", "BadRequest", "close_loop_servers"]
