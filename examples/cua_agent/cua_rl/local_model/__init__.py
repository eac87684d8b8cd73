"""Tiny offline VLM builder and CPU inference server (the embedded default when no GPU is present).

``build_tiny(out_dir, seed=0)`` writes a tiny random Qwen3-VL checkpoint; ``cua-model serve MODEL_DIR`` (or
``start_model_server`` / ``ModelServerProcess``) serves it with the vLLM API subset AReaL's remote vLLM
engine uses. See docs/cpu-backend.md.
"""

from .launch import ModelServerProcess, start_model_server
from .packed_attention import enable_packed_sdpa
from .tiny import TinySpec, build_tiny

__all__ = ["build_tiny", "TinySpec", "start_model_server", "ModelServerProcess", "enable_packed_sdpa"]
