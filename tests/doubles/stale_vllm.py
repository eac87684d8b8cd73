"""Test double of a broken engine: a vLLM worker extension that acknowledges every weight update and keeps
serving the weights it started with.

Why a double: no setting makes AReaL's vLLM ignore an update, yet it is the failure the health check
``sampler_logprob_gap`` (cua_rl/trainer/health.py) exists for (an update path that fails silently on
some engine version or network file system). AReaL labels the tokens with the version it believes vLLM
serves, so only the trainer's recomputed logprobs can show it. Used by ``vllm.worker_extension_cls`` in
bench/health_bench.py's ``stale_weights`` case; the engine process imports it from the repository root (the
trainer's working directory).
"""

from cua_rl.local_model.vllm_cpu import CPUWorkerExtension


class IgnoresWeightUpdates(CPUWorkerExtension):
    def areal_update_weights(self, model_path):
        print(f"[test double] vLLM worker IGNORED the weights at {model_path}", flush=True)
        return True, "ignored by the test double"
