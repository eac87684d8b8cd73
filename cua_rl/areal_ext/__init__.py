"""What this project adds to AReaL itself, as opposed to the plug-in AReaL calls (config, dataset, workflow):
``worker`` (AReaL's RPC worker with the trainer-side patches, the command the configs name),
``packed_attention`` and ``trainer_logprobs`` (the patches it applies), ``vllm_config`` (AReaL's vLLM config
plus ``logprobs_mode``), ``resume`` (atomic recover points, each stream item trained once) and
``model_watch`` (stops a run whose model server died). Kept import-free: the worker command and the config
import single modules from here."""
