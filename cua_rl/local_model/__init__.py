"""The model of the embedded default without a GPU: a tiny offline Qwen3-VL, served by real vLLM.

``build_tiny(out_dir, seed=0)`` writes a tiny random Qwen3-VL checkpoint (``cua-model build-tiny``).
``vllm_cpu.CPUWorkerExtension`` is the vLLM worker extension that keeps in-place weight updates working on
the CPU; ``vllm_server.VLLMServer`` starts AReaL's vLLM server the way AReaL does, for tests and benches.
Training never starts a server here: AReaL's scheduler launches vLLM. See docs/cpu-backend.md.
"""

from .tiny import TinySpec, build_tiny

__all__ = ["build_tiny", "TinySpec"]
