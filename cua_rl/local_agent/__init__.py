"""Embedded gbox-mini-agent-compatible agent service (``cua-agent serve``).

Public surface:
- :func:`start_agent_server` (host, port=0, settings) -> handle with ``.url`` / ``.stop()``: in-process server
  for tests and the embedded launcher;
- :func:`create_app` (settings) -> the FastAPI app; :class:`AgentSettings` its service-wide defaults;
- :class:`RunRequest`: the ``POST /runs`` payload (docs/protocols.md §2.2 plus ``apiKey``, ``sampling``);
- :mod:`.formats`: the pluggable prompt formats (``qwen3-vl``, ``mai-ui``, ``keyboard``) and their registry.
"""

from .formats import PromptFormat, format_names, get_format, register_format
from .runner import AgentSettings
from .schema import RunRequest
from .server import create_app, start_agent_server

__all__ = ["AgentSettings", "PromptFormat", "RunRequest", "create_app", "format_names", "get_format",
           "register_format", "start_agent_server"]
