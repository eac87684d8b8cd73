"""AReaL's own vLLM server (``areal.engine.vllm_ext.areal_vllm_server``) as a child process, for tests,
benchmarks and ``cua-eval`` (on the CPU, or on a GPU with a GPU recipe's ``vllm`` section), which need a served
model without a trainer.

Training never uses this: AReaL's scheduler launches vLLM itself, on the CPU as on a GPU. This class builds
the same command line AReaL builds (``vLLMConfig.build_cmd`` of the config class training uses) with the same CPU environment
(``CPU_ENV``, which the launcher also exports), so what the tests prove holds for the server a run uses.

The child exits when its parent dies (PR_SET_PDEATHSIG), and ``stop()`` ends its whole process group
(vLLM's API server forks an engine-core process).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from cua_rl.http.serve import free_port

# What vLLM needs on a machine without a GPU; launch.py exports it for AReaL-launched servers too.
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",   # GiB of KV cache (vLLM's CPU default is 4 per server)
    "VLLM_PLUGINS": "none",          # skip AReaL's awex plugin, which needs Megatron and only logs a traceback
    # vLLM's sampler and logprob ranks are torch.compile'd even with enforce_eager; on the CPU the first request
    # then waits for TorchDynamo and Inductor (3.7 s with a warm Inductor cache, far more on a fresh machine;
    # 0.07 s without). Eager runs the same operations.
    "TORCHDYNAMO_DISABLE": "1",
    # the rollout worker keeps vLLM's default cache directory, where the model class is already inspected
    # (cua_rl/areal_ext/worker.py share_vllm_cache: 9 s of every server start otherwise)
    "CUA_RL_SHARED_VLLM_CACHE": "1",
}
# The worker extension that makes in-place weight updates work on the CPU (vllm_cpu.py).
CPU_WORKER_EXTENSION = "cua_rl.local_model.vllm_cpu.CPUWorkerExtension"


def socket_dir() -> str:
    """A new folder for vLLM's ZMQ sockets, for ``VLLM_RPC_BASE_PATH``: vLLM opens them (``ipc://``) in the
    system's temporary folder by default and leaves them there when its server is killed, one per server (141
    sockets in /tmp after a day of runs). Whoever starts the server removes the folder when it stops."""
    import tempfile

    return tempfile.mkdtemp(prefix="cua-vllm-sockets-")


def cpu_vllm_config(model_dir: str | Path, *, max_model_len: int = 8192, max_num_seqs: int = 16, seed: int = 1,
                    dtype: str = "float32", prefix_caching: bool = False):
    """The ``vllm`` section of config.cpu.yaml for ``model_dir`` (tests/local_model/test_vllm_server_cmd.py
    keeps the two equal). ``prefix_caching`` stays off as in AReaL's default (weights change under in-flight
    requests during training); a server that only evaluates fixed checkpoints may turn it on: every weight
    load goes through ``pause_generation(clear_cache=True)``, which drops the cached blocks."""
    from cua_rl.areal_ext.vllm_config import CUAvLLMConfig

    return CUAvLLMConfig(model=str(model_dir), seed=seed, dtype=dtype, max_model_len=max_model_len,
                         max_num_seqs=max_num_seqs, enforce_eager=True, distributed_executor_backend="uni",
                         worker_extension_cls=CPU_WORKER_EXTENSION, disable_sliding_window=False,
                         gpu_memory_utilization=0.85, no_enable_prefix_caching=not prefix_caching)


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setsid()


def gpu_vllm_config(vllm, model_dir: str | Path, *, prefix_caching: bool = False):
    """A run's ``vllm`` section (``CUAvLLMConfig`` of a GPU recipe: its memory share, context, dtype, seed and
    the project's logprobs mode) serving ``model_dir``: the server AReaL's scheduler starts for a rollout, one
    GPU (tp 1), for a checkpoint ``cua-eval`` evaluates. ``prefix_caching``: as in ``cpu_vllm_config``."""
    import dataclasses

    return dataclasses.replace(vllm, model=str(model_dir), no_enable_prefix_caching=not prefix_caching)


def server_command(cfg, host: str, port: int, *, on_cpu: bool = True,
                   tool_call_parser: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of ``areal_vllm_server`` for the vLLM config ``cfg``, built as AReaL builds it
    (``vLLMConfig.build_args`` and ``build_cmd_from_args``, tp 1, pp 1); ``on_cpu``: with ``CPU_ENV``, else the GPU
    (the machine's CUDA_VISIBLE_DEVICES: vLLM takes the first GPU it sees)."""
    from areal.api.cli_args import vLLMConfig

    args = vLLMConfig.build_args(cfg, tp_size=1, pp_size=1, host=host, port=port)
    if tool_call_parser:   # vLLM's own tool-call parsing on its chat route (tests compare the endpoint's with it)
        args.update(enable_auto_tool_choice=True, tool_call_parser=tool_call_parser)
    # AReaL's launchers set this for every server they start: LoRA updates go through /v1/load_lora_adapter
    env = {**os.environ, **(CPU_ENV if on_cpu else {}), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    return vLLMConfig.build_cmd_from_args(args), env


class VLLMServer:
    """``areal_vllm_server`` for ``model_dir`` on ``host:port``; ``addr`` is what AReaL's engine wants. On the CPU
    (``cpu_vllm_config``), or, given ``vllm_config`` (``gpu_vllm_config``), with that config on a GPU."""

    def __init__(self, model_dir: str | Path, *, host: str = "127.0.0.1", port: int | None = None,
                 max_model_len: int = 8192, max_num_seqs: int = 16, seed: int = 1, dtype: str = "float32",
                 log_path: str | Path | None = None, start_timeout_s: float = 600.0, prefix_caching: bool = False,
                 tool_call_parser: str | None = None, max_lora_rank: int | None = None,
                 lora_modules: list[str] | None = None, vllm_config=None):
        self.host, self.port = host, port or free_port(host)
        cfg = vllm_config or cpu_vllm_config(model_dir, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                             seed=seed, dtype=dtype, prefix_caching=prefix_caching)
        if max_lora_rank:   # serve LoRA adapters as a run with actor.use_lora does (cua_rl.deploy.wire_lora), the
            # initial ones given as AReaL's trainer gives them ("name-v0=path")
            cfg.enable_lora, cfg.max_lora_rank, cfg.lora_modules = True, max_lora_rank, lora_modules
        self.cmd, env = server_command(cfg, host, self.port, on_cpu=vllm_config is None,
                                       tool_call_parser=tool_call_parser)
        self.socket_dir = env["VLLM_RPC_BASE_PATH"] = socket_dir()   # removed by stop
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=_die_with_parent)
        try:
            self._wait_healthy(start_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - self.started

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self.proc.returncode} before it was healthy")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"vLLM server did not become healthy within {timeout_s:.0f} s")

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # the engine core and its workers, whatever the API server did on SIGTERM
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(5)
        if self._log is not subprocess.DEVNULL:
            self._log.close()
            self._log = subprocess.DEVNULL
        shutil.rmtree(self.socket_dir, ignore_errors=True)   # the sockets of a server that is gone

    def __enter__(self) -> "VLLMServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
