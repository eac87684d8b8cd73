"""What this project adds inside AReaL's own processes, as opposed to the plug-in AReaL calls (config,
dataset, workflow) and our trainer around it (``cua_rl.trainer``): ``worker`` (AReaL's RPC worker with the
trainer-side patches, the command the configs name), ``packed_attention``, ``compact_images``,
``entropy_bonus``, ``local_shards``, ``lora_vlm`` and ``trainer_logprobs`` (the patches it applies),
``vllm_config`` (AReaL's vLLM config plus ``logprobs_mode``) and ``ray_cluster`` (joining a Ray cluster with
those patches). Kept import-free: the worker command, the config and the trainer's health checks import single
modules or names from here."""

# The statistic ``trainer_logprobs`` records in the training worker and the health check ``sampler_logprob_gap``
# (cua_rl/trainer/health.py) reads: defined here so the reader needs neither torch nor the patch.
SAMPLER_GAP_KEY = "sampler_logprob_gap"
