"""AReaL's deployment rules for a run of this project: what the run's own settings ask of AReaL's sections, checked
and, where one switch implies the others, written into them, once, when a ``CUAConfig`` loads (``apply``).

Why a module of its own: ``cua_rl.config`` is the schema (each setting, its default and its own checks); the rules
here are about AReaL's sections and how they must agree with each other and with ours: the sampling the trainer
recomputes, one length limit, the KL penalty's reference and weighting, the training engine and the workers' command, the
placement of the roles on a node's GPUs, LoRA's wiring, and the reward and advantage normalisations that would
undo the workflow's own group normalisation. Each rule raises ``ValueError`` naming the setting and the fix.

``apply`` holds for any host; ``check_host`` checks what the launching host must have for the config (the
attention implementation's package), run by the launcher before any process starts (a config built in a test
or on another host is not refused for what this host lacks).
"""

from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING

from cua_rl.trajectory import value_bound

if TYPE_CHECKING:
    from cua_rl.config import CUAConfig

# The command of the RPC workers AReaL's local and Slurm schedulers start (``scheduling_spec[0].cmd``): AReaL's own
# worker module with this project's patches (cua_rl/areal_ext/worker.py), and the module it stands for.
WORKER_MODULE, AREAL_WORKER_MODULE = "cua_rl.areal_ext.worker", "areal.infra.rpc.rpc_server"


# AReaL sends top_k=1e8 (its default) for "no top-k"; anything from here up cannot truncate a vocabulary.
NEUTRAL_TOP_K = 1_000_000


# The modules LoRA may adapt: the language model's attention and MLP projections (Qwen-VL's names; the vision
# tower's are qkv, proj and linear_fc*). The default is the first four.
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def actor_without_kl():
    """``CUAConfig``'s default actor: AReaL's, with no KL penalty (AReaL's default ``kl_ctl`` is 0.1, which with
    the default ``trajectory.group_weight: equal`` ``check_kl_weight`` refuses; the recipes set 0 too)."""
    from areal.api.cli_args import PPOActorConfig

    return PPOActorConfig(kl_ctl=0.0)


def reference_model(actor):
    """The KL penalty's reference when the config names none: the actor's own model (path, backend, dtype,
    attention, micro-batches) frozen at its starting weights, with no optimizer (AReaL's ref engine only computes
    logprobs), **on the actor's GPUs, in the actor's worker processes**: colocated with the actor without a fork.

    Why colocated: a reference that copied the actor's placement (GPUs of its own) needs as many GPUs again, and
    on a node the actor and vLLM already fill (config.yaml: 4 + 4 of 8) AReaL's round-robin scheduler put vLLM
    on the actor's GPUs instead. Why without a fork: AReaL's fork starts its stock RPC worker, without this
    project's patches (cua_rl/areal_ext/worker.py), and an unpatched FSDP engine would read the rows' palette-coded
    images as pixel values (compact_images.py); the actor's own workers have them (AReaL keeps several engines per
    worker, "actor/0" and "ref/0"). Stored in the actor's compute dtype: its logprobs come from weights cast to
    that dtype anyway, so a second fp32 master copy would add memory and change nothing. A ``ref`` section in the
    config wins over all of this (GPUs of its own, where the node has them: ``check_placement``)."""
    import copy

    from areal.api.cli_args import SchedulingStrategy

    ref = copy.deepcopy(actor)
    ref.optimizer = None
    ref.kl_ctl = 0.0
    ref.optimizer_dtype = actor.dtype
    ref.scheduling_strategy = SchedulingStrategy(type="colocation", target="actor", fork=False)
    return ref


def _replicas(backend: str, name: str, rollout: bool) -> tuple[int, int]:
    """(workers, GPUs per worker when on GPUs) of a role as AReaL's controllers create them: a training role has
    one worker per rank of its parallel world; a rollout one per data-parallel instance of tp x pp GPUs."""
    from areal.api.alloc_mode import ModelAllocation

    parallel = ModelAllocation.from_str(backend, name=name).parallel
    if rollout:
        return parallel.dp_size, parallel.tp_size * parallel.pp_size
    return parallel.world_size, 1


def check_sampling(config: CUAConfig) -> None:
    """The behaviour policy is the distribution the trainer recomputes: plain sampling at the actor's
    temperature. A truncated or penalised distribution, greedy decoding or another temperature would
    make vLLM's logprobs and the trainer's disagree on every token, silently. (The policy endpoint also
    sends neutral penalties and min_p, so a checkpoint's generation_config cannot change them.)"""
    g = config.gconfig
    wrong = []
    if g.greedy:
        wrong.append("gconfig.greedy must be false (training samples; greedy is for evaluation only)")
    if getattr(g, "use_beam_search", False):
        wrong.append("gconfig.use_beam_search must be false")
    if g.top_p != 1.0:
        wrong.append(f"gconfig.top_p must be 1.0, got {g.top_p}")
    if 0 < g.top_k < NEUTRAL_TOP_K:
        wrong.append(f"gconfig.top_k must not truncate (<= 0 or >= {NEUTRAL_TOP_K}), got {g.top_k}")
    if g.frequency_penalty != 0.0:
        wrong.append(f"gconfig.frequency_penalty must be 0, got {g.frequency_penalty}")
    if config.actor.temperature != g.temperature:
        wrong.append(f"actor.temperature ({config.actor.temperature}) must equal gconfig.temperature "
                     f"({g.temperature}): the trainer recomputes logprobs at the sampling temperature")
    if wrong:
        raise ValueError("sampling must be the distribution the trainer computes: " + "; ".join(wrong))


def check_lengths(config: CUAConfig) -> None:
    """One length limit. A training row is one prompt plus its reply, and the policy endpoint refuses a
    prompt that leaves no room under ``gconfig.max_tokens``; so that limit must fit vLLM's context (else
    vLLM fails the turn) and one trainer micro-batch (else AReaL's packer fails the whole step)."""
    g = config.gconfig
    limits = {"vllm.max_model_len": config.vllm.max_model_len,
              "actor.mb_spec.max_tokens_per_mb": config.actor.mb_spec.max_tokens_per_mb}
    for name, value in limits.items():
        if value is not None and g.max_tokens > value:
            raise ValueError(f"gconfig.max_tokens ({g.max_tokens}) exceeds {name} ({value}): a row that "
                             f"long would fail there. Set gconfig.max_tokens <= "
                             f"{min(v for v in limits.values() if v is not None)}")
    if g.max_new_tokens >= g.max_tokens:
        raise ValueError(f"gconfig.max_new_tokens ({g.max_new_tokens}) must be below gconfig.max_tokens "
                         f"({g.max_tokens}), which also holds the prompt")


def check_train_engine(config: CUAConfig) -> None:
    """The rows carry their images as palette codes that only AReaL's FSDP engine, patched in the training
    workers, decodes before its forward (cua_rl/areal_ext/compact_images.py); another engine would read the
    codes as pixel values, silently."""
    from omegaconf import MISSING  # a backend not set yet (the defaults' value) is not another engine

    for name, engine in (("actor", config.actor), ("ref", config.ref)):
        backend = getattr(engine, "backend", None) or ""   # ref: None without a KL penalty
        if backend not in ("", MISSING) and not backend.startswith("fsdp"):
            raise ValueError(f"{name}.backend {backend!r}: training here runs on AReaL's FSDP engine "
                             f"(fsdp:...); the rows' images are palette codes its patched micro-batches "
                             f"decode (cua_rl/areal_ext/compact_images.py), which another engine would "
                             f"read as pixels")


def check_worker_commands(config: CUAConfig) -> None:
    """The actor's, the reference's and the rollout's workers must run ``cua_rl.areal_ext.worker``: without its
    patches the FSDP engine reads the rows' palette-coded images as pixels, silently, and packed sequences
    attend across each other on the CPU. AReaL's own command (its default, and what its example configs
    write) becomes ours, the rest of the command kept; another command is refused. Not under Ray, whose
    workers take the same patches from a setup hook and no command (cua_rl/areal_ext/ray_cluster.py)."""
    if getattr(config.scheduler, "type", None) == "ray":
        return
    for name in ("actor", "ref", "rollout"):
        specs = getattr(getattr(config, name, None), "scheduling_spec", None) or ()
        if not specs or WORKER_MODULE in (specs[0].cmd or ""):
            continue
        cmd = specs[0].cmd or f"python -m {AREAL_WORKER_MODULE}"
        if AREAL_WORKER_MODULE not in cmd:
            raise ValueError(f"{name}.scheduling_spec[0].cmd {cmd!r}: the workers here run {WORKER_MODULE} "
                             f"(AReaL's {AREAL_WORKER_MODULE} with this project's patches: without them the "
                             f"images of the rows are read as pixels), e.g. 'python3 -m {WORKER_MODULE}'")
        specs[0].cmd = cmd.replace(AREAL_WORKER_MODULE, WORKER_MODULE)


def _roles(config: CUAConfig) -> list[tuple[str, object, tuple[int, int]]]:
    """(name, engine, (workers, GPUs per worker)) of each role a run creates, in AReaL's order (actor, critic, the
    KL penalty's reference when on, rollout)."""
    roles = [(name, engine, _replicas(engine.backend, name, rollout=False))
             for name, engine in (("actor", config.actor), ("critic", config.critic), ("ref", config.ref))
             if engine is not None and (name != "ref" or config.actor.kl_ctl > 0)]
    roles.append(("rollout", config.rollout, _replicas(config.rollout.backend, "rollout", rollout=True)))
    return roles


def _own_gpus(name: str, engine, replicas: int, per_replica: int) -> int:
    """The GPUs a role not colocated with another takes: a rollout's per server (tp x pp) when it is on GPUs, a
    training role's ``scheduling_spec[0].gpu`` per worker."""
    spec = engine.scheduling_spec[0]
    return replicas * (per_replica if spec.gpu > 0 else 0) if name == "rollout" else replicas * spec.gpu


def gpus_used(config: CUAConfig) -> int:
    """The GPUs the run's roles hold on a node: the sum over the roles on GPUs of their own (a colocated role
    shares its target's), as AReaL's controllers count them (``_replicas``)."""
    return sum(_own_gpus(name, engine, *counts) for name, engine, counts in _roles(config)
               if str(getattr(engine.scheduling_strategy.type, "value", engine.scheduling_strategy.type))
               != "colocation")


def check_placement(config: CUAConfig) -> None:
    """AReaL's local scheduler creates the roles in the trainer's order (actor, critic, ref, then rollout;
    ``PPOTrainer.__init__``) and hands GPUs out round-robin without ever refusing: a role colocated with one
    created after it fails at start, and roles on GPUs of their own that need more GPUs than the node has
    wrap round onto GPUs already taken (vLLM on the actor's, where its memory share cannot be met). Both are
    refused here, at load time (tests/run/test_gpu_placement.py runs AReaL's scheduler on the recipes)."""
    if getattr(config.scheduler, "type", "local") != "local":
        return
    roles = _roles(config)
    created: dict[str, int] = {}
    gpus = 0
    for name, engine, (replicas, per_replica) in roles:
        strategy = engine.scheduling_strategy
        if str(getattr(strategy.type, "value", strategy.type)) == "colocation":
            target = strategy.target
            if target not in created:
                raise ValueError(f"{name}.scheduling_strategy colocates it with {target!r}, which AReaL does not "
                                 f"create before it (its order: {', '.join(r for r, _, _ in roles)}): colocate "
                                 f"the later role with the earlier one instead (e.g. rollout.scheduling_strategy "
                                 f"{{type: colocation, target: actor}})")
            if replicas != created[target]:
                raise ValueError(f"{name} ({replicas} workers) is colocated with {target} ({created[target]} "
                                 f"workers): AReaL needs the same number of workers on both")
        else:
            gpus += _own_gpus(name, engine, replicas, per_replica)
        created[name] = replicas
    node = config.cluster.n_gpus_per_node
    if node and gpus > node:
        raise ValueError(f"the roles on GPUs of their own need {gpus} GPUs and the node has {node} "
                         f"(cluster.n_gpus_per_node): AReaL's local scheduler would hand the rest out again from "
                         f"GPU 0, onto GPUs another role holds. Colocate a role (e.g. the KL penalty's reference "
                         f"with the actor, as the default reference is) or use fewer GPUs per role")


def wire_lora(config: CUAConfig) -> None:
    """``actor.use_lora`` is the one switch: the rollout side, vLLM's adapter support, the adapter's name and
    its modules follow from it (AReaL asks for each in its own section). Only the language model's
    projections: vLLM leaves adapters on the vision tower unapplied unless told (its
    enable_tower_connector_lora), which would make the sampler and the trainer disagree silently."""
    if not config.actor.use_lora:
        return
    modules = list(config.actor.target_modules) or list(LORA_MODULES[:4])
    outside = sorted(set(modules) - set(LORA_MODULES))
    if outside:
        raise ValueError(f"actor.target_modules {outside}: LoRA here adapts the language model's projections only "
                         f"({', '.join(LORA_MODULES)}); vLLM would not apply adapters elsewhere (the vision tower)")
    config.actor.target_modules = modules
    name = config.gconfig.lora_name or "policy"
    config.gconfig.lora_name = name
    if config.eval_gconfig is not None:
        config.eval_gconfig.lora_name = name
    config.rollout.use_lora, config.rollout.lora_name = True, name
    config.vllm.enable_lora = True
    config.vllm.max_lora_rank = max(config.vllm.max_lora_rank, config.actor.lora_rank)


def check_reward_norm(config: CUAConfig) -> None:
    """AReaL's ``reward_norm`` slices the batch into blocks of ``group_size`` rows. A row here is a turn
    (or an episode in concat), so its blocks cross episodes and tasks; and the workflow has already
    normalised every group (``trajectory.normalise_in_group``), so a batch mean would re-centre it too."""
    norm = config.actor.reward_norm
    if norm is None:
        return
    levels = {norm.mean_level, norm.std_level}
    if "group" in levels:
        raise ValueError(f"actor.reward_norm with a group level (mean_level {norm.mean_level!r}, std_level "
                         f"{norm.std_level!r}) normalises blocks of {norm.group_size} rows; a row here is a "
                         f"turn, so the blocks cross episodes and tasks. Set actor.reward_norm to null: the "
                         f"workflow normalises each group itself (trajectory.normalise_in_group)")
    if config.trajectory.normalise_in_group:
        raise ValueError(f"actor.reward_norm must be null while trajectory.normalise_in_group is on (got "
                         f"mean_level {norm.mean_level!r}, std_level {norm.std_level!r}): the workflow has "
                         f"already normalised and weighted each group's rewards; AReaL would normalise them "
                         f"again over the batch's rows (as AReaL's GRPO examples do, which copy in "
                         f"reward_norm: {{mean_level: group}})")


def check_reward_clip(config: CUAConfig) -> None:
    """AReaL clips ``rewards`` at +-``actor.reward_clip`` (default 20) before anything else, and the rows'
    rewards are the workflow's values (``cua_rl.trajectory.episode_values``: group-normalised, weighted).
    A clip they could reach would cut exactly the rare short successes' credit, silently."""
    a, t = config.actor, config.trajectory
    bound = value_bound(config.gconfig.n_samples, config.max_turns, config.gconfig.max_new_tokens,
                        **t.value_options(), reward_range=1.0 + t.format_reward + t.action_reward)
    reach = (bound + abs(a.reward_bias)) * abs(a.reward_scaling)
    if a.reward_clip < reach:
        raise ValueError(
            f"actor.reward_clip ({a.reward_clip:g}) could clip the values the workflow trains with: with "
            f"gconfig.n_samples {config.gconfig.n_samples}, max_turns {config.max_turns}, gconfig.max_new_tokens "
            f"{config.gconfig.max_new_tokens} and trajectory.group_weight {t.group_weight!r} an episode's value "
            f"reaches {reach:.6g} (a 1-token success among the longest failures; reward_bias and "
            f"reward_scaling included), and AReaL clips rewards before anything else. Set actor.reward_clip "
            f">= {reach:.6g} (the recipes set 1e9)")


def apply(config: CUAConfig) -> None:
    """Every rule, in order, on a config whose own fields are already checked (``CUAConfig.__post_init__``)."""
    check_sampling(config)
    check_lengths(config)
    wire_reference(config)
    check_kl_weight(config)
    check_train_engine(config)
    check_worker_commands(config)
    check_placement(config)
    wire_lora(config)
    check_reward_norm(config)
    check_reward_shift(config)
    check_reward_clip(config)
    check_adv_norm(config)


def wire_reference(config: CUAConfig) -> None:
    """``actor.kl_ctl`` a finite number >= 0; with a KL penalty and no ``ref`` section, the reference is the
    actor's own starting weights (``reference_model``)."""
    if not (math.isfinite(config.actor.kl_ctl) and config.actor.kl_ctl >= 0):
        raise ValueError(f"actor.kl_ctl must be a number >= 0, got {config.actor.kl_ctl}")
    if config.actor.kl_ctl > 0 and config.ref is None:
        config.ref = reference_model(config.actor)


def check_kl_weight(config: CUAConfig) -> None:
    """A KL penalty only with ``trajectory.group_weight: tokens``. AReaL 1.0.4 adds ``-kl_ctl * KL`` to every
    token's reward with one scalar (its loss mask is boolean: nothing per row scales it), while ``equal`` divides
    each row's reward by its group's mean trained tokens (~1e-3 at 20 turns of 50 tokens): the KL's weight
    against the task then grows with the group's length (16.7x the task at kl_ctl 0.05, a success trained down).

    Why a refusal and not a worker patch that scales each row's KL by its row's weight: such a patch replaces
    AReaL's scalar ``kl_ctl`` inside its ``_compute_advantages`` and needs a per-row key to survive AReaL's batch
    path (the controller's split across data-parallel ranks, micro-batching), which only a trainer run shows;
    the KL is off by default, and ``tokens`` (AReaL's own weighting, the CPU learning recipes') keeps the KL's
    share as AReaL's. Lift this when such a patch exists and is tested through a trainer."""
    if config.actor.kl_ctl > 0 and config.trajectory.group_weight != "tokens":
        raise ValueError(f"actor.kl_ctl {config.actor.kl_ctl:g} needs trajectory.group_weight=tokens (got "
                         f"{config.trajectory.group_weight!r}): AReaL adds the KL penalty to every token's reward "
                         f"unscaled, while {config.trajectory.group_weight!r} divides each row's reward by its "
                         f"group's mean trained tokens, so the KL would outweigh the task (and train successes "
                         f"down) in long groups. Set trajectory.group_weight=tokens, or actor.kl_ctl=0")


def check_reward_shift(config: CUAConfig) -> None:
    """AReaL computes ``(reward + reward_bias) * reward_scaling`` on every row; the rows' rewards are the workflow's
    values, already normalised within each group and weighted per episode, so a bias shifts every token of every
    episode one way (AReaL's example values, -0.5 and 10, made a success pull -247 and pushed every token down)."""
    a = config.actor
    if not config.trajectory.normalise_in_group:
        return
    for name, value, neutral in (("reward_bias", a.reward_bias, 0.0), ("reward_scaling", a.reward_scaling, 1.0)):
        if value != neutral:
            raise ValueError(f"actor.{name} must be {neutral:g} while trajectory.normalise_in_group is on (got "
                             f"{value:g}): the rows' rewards are the workflow's group-normalised, per-episode values, "
                             f"and AReaL would shift or scale them again (set the reward's scale in the gym, or "
                             f"trajectory.normalise_in_group=false to hand AReaL the raw rewards)")


def check_adv_norm(config: CUAConfig) -> None:
    """The group baseline is the only one: AReaL's batch-mean advantage normalisation is refused while the workflow
    normalises groups (the learning bench's ``batch_recentring`` mutation switches it back on)."""
    norm = config.actor.adv_norm
    if config.trajectory.mutation == "batch_recentring" and norm is not None:
        norm.mean_level = "batch"   # the learning bench's mutation: issue 33 (a) switched back on
    elif config.trajectory.normalise_in_group and norm is not None and norm.mean_level is not None:
        raise ValueError(f"actor.adv_norm.mean_level must be null while trajectory.normalise_in_group is on "
                         f"(got {norm.mean_level!r}): the group baseline is the only one; a mean over the "
                         f"batch's tokens hands all-fail groups a positive advantage when failures run longer")


# The attention implementations (AReaL's ``attn_impl``, transformers' ``attn_implementation``) that need a package
# of their own; sdpa and eager are PyTorch's. A Hub kernel ("kernels-community/...") needs the kernels package.
ATTENTION_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def attention_package(impl: str) -> str | None:
    """The importable package ``impl`` needs, or None for PyTorch's own (sdpa, eager)."""
    if impl in ATTENTION_PACKAGES:
        return ATTENTION_PACKAGES[impl]
    return "kernels" if "/" in (impl or "") else None


def check_host(config: CUAConfig) -> None:
    """What this host must have for the config, told before any process starts: each training engine's attention
    implementation importable (transformers raises at model load otherwise, minutes into the run)."""
    for name in ("actor", "ref"):
        engine = getattr(config, name, None)
        impl = getattr(engine, "attn_impl", None)
        package = attention_package(impl)
        if package and importlib.util.find_spec(package) is None:
            raise ValueError(f"{name}.attn_impl {impl!r} needs the Python package {package!r}, which is not "
                             f"importable here: install it, or set {name}.attn_impl=sdpa (PyTorch's own "
                             f"attention, the recipes' choice; packed sequences stay apart through "
                             f"cua_rl/areal_ext/packed_attention.py)")


# --- The GPUs present on the launching node (AReaL's local scheduler, one node) --------------------------------
# The keys an allocation is made of. An override of one of them, or of a mapping that holds one (``cluster=...``),
# means the user set the allocation: the launcher keeps it and checks it (``check_gpus``). Without one, and
# without a config file of the user's, the launcher fits the default recipe to the GPUs present (``fit_default``).
ALLOCATION_KEYS = ("cluster.n_gpus_per_node", "cluster.n_nodes", "scheduler.type", "enable_offload",
                   *(f"{role}.{key}" for role in ("actor", "ref", "critic", "rollout")
                     for key in ("backend", "scheduling_strategy", "scheduling_spec")))
RECIPE_GPUS = 8   # config.yaml's own allocation: vLLM d4 + FSDP d4 on cluster.n_gpus_per_node 8


def override_key(arg: str) -> str:
    """The config key of a Hydra override (``++a.b=1``, ``+a.b=1``, ``~a.b``, ``a.b=1`` -> ``a.b``)."""
    return arg.split("=", 1)[0].lstrip("+~").strip()


def allocation_overrides(overrides: list[str]) -> list[str]:
    """The overrides that set (part of) the allocation: a key of ``ALLOCATION_KEYS``, one below it
    (``actor.scheduling_spec.0.gpu``) or a mapping above it (``rollout``)."""
    def sets(key: str) -> bool:
        return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in ALLOCATION_KEYS)
    return [arg for arg in overrides if sets(override_key(arg))]


def fit_default(present: int) -> tuple[str, list[str]]:
    """(recipe file, overrides) that fit the default recipe to ``present`` GPUs (>= 1) and use all of them on 1,
    2, 4 or 8: one GPU is config.1gpu.yaml (vLLM colocated with the actor, offloaded in turn); more are split in
    halves, vLLM data-parallel on one and the FSDP actor on the other (the KL penalty's reference, when on, sits
    on the actor's: ``reference_model``), on the largest power of two present (vLLM's and FSDP's
    data-parallel sizes stay powers of two, as the recipe's batch sizes divide)."""
    if present < 1:
        raise ValueError(f"no GPU to fit the recipe to (got {present})")
    if present == 1:
        return "config.1gpu.yaml", []
    used = 1 << (present.bit_length() - 1)
    if used == RECIPE_GPUS:
        return "config.yaml", []
    half = used // 2
    return "config.yaml", [f"cluster.n_gpus_per_node={used}", f"rollout.backend=vllm:d{half}p1t1",
                           f"actor.backend=fsdp:d{half}"]


def _one_local_node(config: CUAConfig) -> bool:
    return getattr(config.scheduler, "type", "local") == "local" and (config.cluster.n_nodes or 1) == 1


def check_gpus(config: CUAConfig, present: int) -> None:
    """On one node under AReaL's local scheduler, the roles' GPUs must be present: AReaL hands out the ids
    0..n_gpus_per_node-1 whether they exist or not, and a role on a missing GPU fails minutes into the start.
    Multi-node and Ray runs are placed by their own schedulers on their nodes: not checked here."""
    if not _one_local_node(config):
        return
    used = gpus_used(config)
    if used > present:
        raise ValueError(
            f"the allocation needs {used} GPUs (rollout.backend {config.rollout.backend}, actor.backend "
            f"{config.actor.backend}, cluster.n_gpus_per_node {config.cluster.n_gpus_per_node}) and this node has "
            f"{present} (nvidia-smi -L): give fewer GPUs to the roles (e.g. rollout.backend=vllm:d1p1t1 "
            f"actor.backend=fsdp:d1 cluster.n_gpus_per_node=2), or drop your allocation and let the launcher fit "
            f"the default recipe to the GPUs present")


def gpus_line(config: CUAConfig, present: int | None, how: str) -> str:
    """``uses U of N (how)``: the launcher's ``gpus:`` line (``--dry-run`` and the run's header); ``present``
    None: not counted (CUA_RL_DEVICE=gpu where nvidia-smi lists none)."""
    used = gpus_used(config)
    where = "" if _one_local_node(config) else " per node"
    return f"uses {used}{where} of {'?' if present is None else present} ({how})"
