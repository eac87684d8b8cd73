"""Typed configuration of the computer-use agent example.

`CUAConfig` extends AReaL's `GRPOConfig` and is loaded exactly like any AReaL config:

    config, config_file = load_expr_config(["--config", "config.yaml", *overrides], CUAConfig)

Importing this module registers CUAConfig as Hydra's schema (``SCHEMA``, named in config.yaml's defaults list), so
every field is a plain ``key=value`` override, listed in the YAML or not.

The flat keys (`gym_base_url`, `max_turns`, ...) keep the names of the original example so that every
train.sh flag maps onto one key (the flag table is `cua_rl/run/cli.py`; values are checked here, once). Settings
that only this project has live in nested sections, each a dataclass checked where it is defined: `policy` (the
endpoint, cua_rl/policy/endpoint.py), `health` (cua_rl/trainer/health.py), `vllm`, and in this module `embedded`,
`task_source` (or `task_sources`), `trajectory`, `tree`, `sft`, `verdict`, `gym_fleet`.

Secrets: `project_token` exists for compatibility, but the launcher never puts a token into the
config (AReaL writes the resolved config to `<fileroot>/logs/.../config.yaml`). It exports the
token as the environment variable PROJECT_TOKEN instead; read it with `resolve_project_token()`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from areal.api.cli_args import GRPOConfig, PPOActorConfig

from cua_rl import deploy
from cua_rl.areal_ext.vllm_config import CUAvLLMConfig
from cua_rl.genv.fleet import join_gym_urls, parse_gym_urls
from cua_rl.genv.fleet_config import GymFleetConfig
from cua_rl.policy import EndpointSettings
from cua_rl.trainer.health import HealthConfig
from cua_rl.trajectory.config import TrajectoryConfig

TASK_SOURCE_KINDS = ("gym", "file", "ids", "custom")
# How a tree group picks its branch points among ``tree.branch_turns`` (cua_rl/workflow/tree.py)
BRANCH_CHOICES = ("every", "unsure")
SPLIT_TYPES = ("train", "eval", "all")
# The gym ids the embedded gym serves: its suites (cua_rl/local_gym/manager.py SUITES; a test keeps them equal).
EMBEDDED_GYM_IDS = ("desktop", "miniwob")
EXISTING_RUN = ("refuse", "overwrite", "resume")
# One range ("001-032") or a comma-separated list of ranges/numbers ("1-8,12,20-24").
_TAG = re.compile(r"^[A-Za-z0-9_.:-]+$")
_RANGE_PART = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_number_ranges(spec: str) -> list[tuple[int, int]]:
    """Parse "001-032" or "1-8,12" into inclusive (low, high) pairs; ValueError on bad input."""
    ranges: list[tuple[int, int]] = []
    for part in spec.split(","):
        m = _RANGE_PART.match(part)
        if not m:
            raise ValueError(
                f"bad task number range {spec!r}: expected e.g. '001-032' or '1-8,12' (part {part!r})"
            )
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        if high < low:
            raise ValueError(f"bad task number range {spec!r}: {low} > {high}")
        ranges.append((low, high))
    return ranges


@dataclass
class EmbeddedStackConfig:
    """Services launch.py starts on this machine when no external gym is given (train.sh
    without --gym): the genv-compatible gym with X11 desktops and the agent service. The model is
    always served by AReaL's vLLM (on the CPU without a GPU), never by this section."""

    enabled: bool | None = field(default=None, metadata={
        "help": "None = automatic: embedded iff gym_base_url is empty. true/false force it."})
    host: str = field(default="127.0.0.1", metadata={
        "help": "Address the embedded gym and agent service listen on (loopback: a token is not needed)."})
    gym_port: int = field(default=0, metadata={
        "help": "The embedded gym's port; 0 picks a free one (tests and CI run several stacks on one machine)."})
    agent_port: int = field(default=0, metadata={"help": "The embedded agent service's port; 0 picks a free one."})
    gym_id: str = field(default="desktop", metadata={
        "help": "The gym id the embedded gym serves: desktop (X11 apps and the curriculum) or miniwob.",
        "choices": list(EMBEDDED_GYM_IDS)})
    tasks_dir: str = field(default="", metadata={
        "help": "A folder of task YAML files for the embedded gym instead of its built-in tasks; tasks whose setup "
                "names a VM image run on QEMU machines (docs/local_gym.md, \"VM desktops\"). Empty = the built-in "
                "tasks."})
    num_desktops: int = field(default=2, metadata={
        "help": "Desktops the gym keeps ready for each task profile in use (its pool_size); the gym keeps at most "
                "GymOptions.max_spares (4) spares in all, so values above 4 act as 4. Each costs ~60-75 MB and a "
                "little CPU."})
    reuse_browsers: int | None = field(default=None, metadata={
        "help": "Browser desktops (gym id miniwob): executions one browser serves, nothing of one episode left for "
                "the next; null = the gym's default (50), 0 = a new browser for each (~1.4 s of CPU per episode). "
                "docs/local_gym.md, \"Browsers are reused\"."})
    restart_in_page: bool | None = field(default=None, metadata={
        "help": "The next MiniWoB++ episode restarts in the used page, as the package's own environment does (null: "
                "the gym's default, on with reused browsers; false: the page loaded again)."})
    tiny_model_dir: str = field(default="", metadata={
        "help": "Tiny offline Qwen3-VL checkpoint (built with `cua-model build-tiny` if missing). Empty = "
                "<CUA_RL_HOME or ~/.cache/cua-rl>/models/tiny-qwen3-vl (see resolve_tiny_model_dir)."})
    ready_timeout_seconds: float = field(default=180.0, metadata={
        "help": "Seconds to wait for each embedded service to answer its health check."})
    start_monitor: bool = field(default=True, metadata={
        "help": "Our Training Monitor (run store + viewer; SQLite in the run's log directory) unless "
                "monitor_base_url points elsewhere. Its URL is printed at start-up; 0 = a free port."})
    monitor_port: int = field(default=0, metadata={"help": "The embedded Training Monitor's port; 0 picks a free one."})
    fault_rate: float = field(default=0.0, metadata={
        "help": "The learning bench's gym-fault mutation only: this share of the embedded gym's actions fails as "
                "the gym's fault (local_gym GymOptions.fault_rate); 0 for every real run."})

    def __post_init__(self):
        for name in ("gym_port", "agent_port", "monitor_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"embedded.{name} must be 0..65535")
        if self.num_desktops < 1:
            raise ValueError("embedded.num_desktops must be >= 1")
        if not 0 <= self.fault_rate < 1:
            raise ValueError(f"embedded.fault_rate must be in [0, 1), got {self.fault_rate}")
        if self.reuse_browsers is not None and self.reuse_browsers < 0:
            raise ValueError(f"embedded.reuse_browsers must be 0 (never) or more, got {self.reuse_browsers}")
        if self.restart_in_page and self.reuse_browsers is not None and self.reuse_browsers < 2:
            raise ValueError("embedded.restart_in_page restarts episodes in a reused browser: it needs "
                             f"embedded.reuse_browsers 2 or more, got {self.reuse_browsers}")
        if self.tasks_dir and not os.path.isdir(os.path.expanduser(self.tasks_dir)):
            raise ValueError(f"embedded.tasks_dir {self.tasks_dir!r} is not a folder (of task YAML files)")


def _plain(value):
    """A config value as plain Python (OmegaConf hands lists and mappings over as its own containers)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def gym_spec(value, key: str = "gym_base_url") -> str:
    """A gym URL setting in its one written form, ``URL`` or ``URL,URL,...``: from one URL, a comma list, a
    YAML list, or ``@FILE`` (one URL a line; read now). A bad URL raises ``ValueError`` naming ``key``."""
    try:
        return join_gym_urls(parse_gym_urls(_plain(value) or ""))
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


@dataclass
class TaskSourceConfig:
    """Where training tasks come from (dataset.py). Tag filter, split and limit (the gym_* keys)
    apply to every kind."""

    kind: str = field(default="gym", metadata={
        "help": "gym: list the gym's tasks; file: a local JSONL/YAML task file; ids: these ids on the gym; custom: "
                "the tasks written below, served by the embedded gym (a genv gym evaluates only the tasks it "
                "defines).",
        "choices": list(TASK_SOURCE_KINDS)})
    task_file: str = field(default="", metadata={"help": "The JSONL or YAML task file of kind file."})
    task_ids: list[str] = field(default_factory=list, metadata={"help": "The task ids on the gym of kind ids."})
    tasks: list[Any] = field(default_factory=list, metadata={
        "help": "kind custom: tasks in the embedded gym's task-file schema (number, name, category, difficulty, "
                "instruction, setup, validators; docs/local_gym.md), checked when the config loads"})
    repeat: int = field(default=1, metadata={
        "help": "Each training task this many times per epoch: several GRPO groups of one task in a step, each on "
                "its own instance seed (for gyms that draw instances by seed, like the curriculum and MiniWoB++)."})
    difficulty: list[str] | None = field(default=None, metadata={
        "help": "Keep tasks of these difficulties (easy, normal, hard; \"medium\" is normal), from the tasks' tags "
                "or their difficulty field; a task with none is left out by the filter. Categories are tags: "
                "gym_tags."})
    tags: list[str] | None = field(default=None, metadata={
        "help": "This source's tag filter instead of gym_tags (in task_sources or as eval_task_source; null: the "
                "run's)."})
    limit: int | None = field(default=None, metadata={
        "help": "at most N tasks of this source per split instead of gym_limit"})
    seed: int | None = field(default=None, metadata={
        "help": "this source's split and sampling seed instead of gym_seed"})
    gym_base_url: Any = field(default="", metadata={
        "help": "this source's gym(s) instead of the run's (rows carry their gym)"})
    gym_id: str = field(default="", metadata={"help": "This source's gym id instead of the run's."})
    weight: float = field(default=1.0, metadata={
        "help": "Share of the training rows per epoch among task_sources (relative; the number of rows stays what "
                "the sources give with repeat: each source's tasks cycle to fill its share)"})

    def __post_init__(self):
        if self.repeat < 1:
            raise ValueError(f"task_source.repeat must be >= 1, got {self.repeat}")
        if not self.weight > 0:
            raise ValueError(f"task_source weight must be > 0, got {self.weight}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"task_source limit must be >= 1 or null, got {self.limit}")
        levels = {"easy", "normal", "medium", "hard"}
        if self.difficulty and not {str(d).lower() for d in self.difficulty} <= levels:
            raise ValueError(f"task_source.difficulty: each of easy, normal (medium), hard; got {self.difficulty}")
        if self.kind not in TASK_SOURCE_KINDS:
            raise ValueError(f"task_source.kind must be one of {TASK_SOURCE_KINDS}, got {self.kind!r}")
        self.gym_base_url = gym_spec(self.gym_base_url, "task_source.gym_base_url")
        if self.kind == "file" and not self.task_file:
            raise ValueError("task_source.kind=file needs task_source.task_file")
        if self.kind == "ids" and not self.task_ids:
            raise ValueError("task_source.kind=ids needs task_source.task_ids")
        if (self.kind == "custom") != bool(self.tasks):
            raise ValueError("task_source.kind=custom needs its tasks (a list of task mappings), and tasks are "
                             "given with kind=custom only")
        if self.tasks:
            from cua_rl.local_gym.tasks import inline_tasks  # only now: the gym's task schema checks them

            self.tasks = [_plain(t) for t in self.tasks]
            self.task_ids = [t.task_id for t in inline_tasks(self.tasks, "task_source.tasks")]

    def custom_tasks(self) -> list[dict]:
        return list(self.tasks) if self.kind == "custom" else []


@dataclass
class TreeConfig:
    """Tree groups (cua_rl/workflow/tree.py; docs/learning.md "Tree groups"): a group's episodes branch on forked
    desktops. Off: plain GRPO groups. On, a group is a tree: its ``n_samples`` roots play the task's instance,
    and every path that reaches a turn of ``branch_turns`` has its desktop forked there (the call of that turn
    held meanwhile; with ``choose`` unsure, only where the policy was unsure of its sampled action) into
    ``branches`` continuations that play on from the same screen and history; each leaf is
    evaluated, and segments are credited against their siblings (cua_rl/trajectory/tree.py). Needs a gym with the
    fork route and an agent that continues another run's history (``startFrom``); a run is refused without them."""

    enabled: bool = field(default=False, metadata={
        "help": "Play tree groups on forked desktops instead of plain GRPO groups."})
    branch_turns: list[int] = field(default_factory=lambda: [2], metadata={
        "help": "path turns where a path forks (each >= 2)"})
    branches: int = field(default=1, metadata={
        "help": "forked continuations per branch point (the path's own goes on too)"})
    fork_wait_seconds: float = field(default=30.0, metadata={
        "help": "how long a fork waits for the gym's capacity (429) before that branch point is skipped (counted)"})
    choose: str = field(default="every", metadata={
        "help": "every: a path forks at each turn of branch_turns it reaches; unsure: those turns are candidates, "
                "and a path forks at one only where the policy was unsure of the action it sampled there (its least "
                "sure sampled token's surprisal at least min_surprisal), within fork_budget forks per group",
        "choices": list(BRANCH_CHOICES)})
    min_surprisal: float = field(default=0.6931, metadata={
        "help": "choose unsure: a path forks where a token of its held call's sampled action had at least this "
                "surprisal (-logprob, nats; the default ln 2: the policy gave the token it sampled at most even odds)"})
    fork_budget: int = field(default=2, metadata={
        "help": "choose unsure: at most this many forks per group (its roots' and their children's together)"})

    def __post_init__(self):
        if self.choose not in BRANCH_CHOICES:
            raise ValueError(f"tree.choose must be one of {BRANCH_CHOICES}, got {self.choose!r}")
        if self.min_surprisal < 0 or self.fork_budget < 1:
            raise ValueError(f"tree.min_surprisal must be >= 0 and tree.fork_budget >= 1, got {self.min_surprisal} "
                             f"and {self.fork_budget}")
        turns = [int(t) for t in self.branch_turns]
        if not turns or any(t < 2 for t in turns) or sorted(set(turns)) != turns:
            raise ValueError(f"tree.branch_turns must be increasing turns >= 2 (a path forks before that turn's "
                             f"model call), got {self.branch_turns}")
        self.branch_turns = turns
        if not 1 <= self.branches <= 8:
            raise ValueError(f"tree.branches must be within 1..8, got {self.branches}")
        if self.fork_wait_seconds < 0:
            raise ValueError(f"tree.fork_wait_seconds must be >= 0, got {self.fork_wait_seconds}")


@dataclass
class SFTConfig:
    """Warm start by SFT on scripted demonstrations (``python -m cua_rl.sft``; cua_rl/sft)."""

    tasks: list[str] = field(default_factory=lambda: ["050", "051", "052"], metadata={
        "help": "Curriculum family tasks (ids or numbers) to demonstrate, and how many training seeds each."})
    demos_per_task: int = field(default=8, metadata={"help": "Training seeds demonstrated per task."})
    seed_offset: int = field(default=0, metadata={
        "help": "first training seed used (curriculum.seeds(\"train\", n, offset))"})
    demo_error_rate: float = field(default=0.0, metadata={
        "help": "An imperfect demonstrator: this fraction of the demonstrations (chosen by seed) plays a "
                "well-formed wrong solution (another key, another cell) and is kept; the model then imitates its "
                "slips, which RL can correct (docs/learning.md). 0 = only correct demonstrations."})
    history_images: int = field(default=3, metadata={
        "help": "Screenshots the agent keeps in its prompt (the agent service's --history-images)."})
    steps: int = field(default=20, metadata={"help": "Optimiser steps of the SFT run."})
    rows_per_step: int = field(default=8, metadata={"help": "Rows (agent turns) in each SFT step."})
    lr: float = field(default=1e-3, metadata={"help": "Learning rate of the SFT optimiser."})
    seed: int = field(default=1, metadata={"help": "Seed of the order the SFT rows are visited in."})
    max_tokens_per_mb: int = field(default=4096, metadata={
        "help": "Tokens per micro-batch (AReaL packs one into a single sequence; CPU attention cost grows with its "
                "square)."})
    output_dir: str = field(default="", metadata={
        "help": "Where the checkpoint goes; empty = <cluster.fileroot>/<experiment>/<trial>/sft. RL starts from it "
                "with actor.path=<dir>."})
    warm_start: bool = field(default=False, metadata={
        "help": "train.sh fine-tunes actor.path on these demonstrations before RL and trains from the result, "
                "built once and kept under <CUA_RL_HOME>/warm-starts, keyed by what it depends on "
                "(cua_rl/sft/warm_start.py)."})

    def __post_init__(self):
        for name in ("demos_per_task", "history_images", "steps", "rows_per_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.demo_error_rate < 1.0:
            raise ValueError(f"sft.demo_error_rate must be in [0, 1), got {self.demo_error_rate}")
        if self.lr <= 0 or self.seed_offset < 0:
            raise ValueError("sft.lr must be positive and sft.seed_offset >= 0")


@dataclass
class VerdictConfig:
    """The run's verdict on learning (cua_rl/verdict.py): after a finished run on the embedded curriculum, held-out
    greedy success of the starting policy and the last step on the learning yardstick's gated regimes."""

    enabled: bool = field(default=True, metadata={
        "help": "Judge learning at the end of a finished run on the embedded curriculum."})
    instances: int = field(default=64, metadata={"help": "held-out instances per gated regime (the learning gate's)"})
    concurrency: int = field(default=16, metadata={
        "help": "episodes at once, each on a desktop of its own (the learning gate's)"})

    def __post_init__(self):
        if self.instances < 1 or self.concurrency < 1:
            raise ValueError(f"verdict.instances and verdict.concurrency must be >= 1, got {self.instances} and "
                             f"{self.concurrency}")




@dataclass
class CUAConfig(GRPOConfig):
    """GRPOConfig plus the keys of the computer-use agent (the original example's names, one per train.sh flag)."""

    # --- the rollout workflows: import paths AReaL resolves on the rollout workers
    workflow: str = field(default="cua_rl.workflow.CUAAgentWorkflow", metadata={
        "help": "Import path of the training rollout workflow class, resolved on AReaL's rollout workers."})
    eval_workflow: str = field(default="cua_rl.workflow.CUAAgentWorkflow", metadata={
        "help": "Import path of the evaluation rollout workflow class, resolved on AReaL's rollout workers."})

    # --- episode limits
    max_turns: int = field(default=20, metadata={
        "help": "Agent turns (model calls) one episode may take; the agent service's maxSteps."})
    max_task_time_seconds: int = field(default=600, metadata={
        "help": "Time limit of one episode in seconds; it also bounds the wait for a gym or agent service that is "
                "down or at capacity."})
    max_turn_time_seconds: int = field(default=120, metadata={
        "help": "Time limit of one turn in seconds (the agent service's step time limit)."})

    # --- gym server (genv API)
    gym_base_url: Any = field(default="", metadata={
        "help": "Gym server base URL (genv API); several: URL,URL,... or a YAML list or @FILE (one URL a line), each "
                "GRPO group placed on one host by capacity (docs/cluster.md); empty: the embedded gym (`embedded`)."})
    gym_id: str = field(default="", metadata={
        "help": "Gym id on that server (without a gym URL: the embedded gym's, desktop or miniwob)."})
    gym_train_ratio: float = field(default=0.8, metadata={
        "help": "Share of the gym's tasks that trains when the split is by ratio (the rest evaluates)."})
    gym_split_type: str = field(default="train", metadata={
        "help": "Which split trains: train, eval, or all (every task; a sanity or overfit run).",
        "choices": list(SPLIT_TYPES)})
    gym_limit: int | None = field(default=None, metadata={
        "help": "At most this many tasks per split (a seeded sample); null for no cap."})
    gym_seed: int = field(default=42, metadata={"help": "Seed of the train/eval split and of the limit's sample."})
    gym_seed_instances: bool = field(default=True, metadata={
        "help": "Send every GRPO group one instance seed (create-execution options.seed; "
                "cua_rl/workflow/seeding.py derives it)."})
    gym_tags: list[str] | None = field(default=None, metadata={"help": "Keep tasks having any of these tags."})
    gym_eval_number_range: str | None = field(default=None, metadata={
        "help": "Task numbers that form the eval split, e.g. 001-032 or 1-8,12; beats gym_train_ratio."})

    # --- agent service (gbox-mini-agent API)
    gbox_mini_agent_base_url: str = field(default="http://127.0.0.1:3000", metadata={
        "help": "Agent service base URL (gbox-mini-agent API), used with agent_service external."})
    agent_service: str = field(default="external", metadata={
        "help": "external: the agent service at gbox_mini_agent_base_url; embedded: ours, started on this machine "
                "beside the policy endpoint to play your gym's tasks (for a gym of your own and no agent service). "
                "The embedded stack (no gym URL) always starts ours.",
        "choices": ["external", "embedded"]})
    gbox_mini_agent_agent: str = field(default="qwen3-vl", metadata={
        "help": "The agent's prompt format: qwen3-vl matches Qwen3-VL, mai-ui MAI-UI checkpoints, keyboard the "
                "Windows example's keyboard-only tags (docs/local_agent.md)."})
    gbox_mini_agent_standard_action_space: str = field(default="pc", metadata={
        "help": "The agent's action space: pc for the embedded X11 desktops, mobile for phone gyms."})
    gbox_mini_agent_extra: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "Service-specific fields sent as-is in every run request, e.g. {historyImages: 6} for the embedded "
                "agent (screenshots it keeps in the prompt; the multi-turn recipe keeps all, so a turn's prompt "
                "extends the previous one and an episode trains as one row: trajectory.export_style=concat)."})

    # --- the model the agent calls: always this run's policy endpoint (AReaL serves the policy)
    model_base_url: str = field(default="", metadata={
        "help": "AReaL's cua_agent example's model server key, refused when set: a run whose agent calls another "
                "model trains nothing (cua-eval --model-url evaluates a model served elsewhere)."})
    model_name: str = field(default="", metadata={
        "help": "Model name the agent sends; the policy endpoint serves one model whatever the name."})

    # --- regularisers
    # AReaL's actor section, with no KL penalty by default (AReaL's kl_ctl default is 0.1; the recipes set 0): a KL
    # penalty needs trajectory.group_weight tokens (cua_rl.deploy.check_kl_weight)
    actor: PPOActorConfig = field(default_factory=deploy.actor_without_kl, metadata={
        "help": "AReaL's actor (PPOActorConfig); here actor.kl_ctl defaults to 0, and a KL penalty (kl_ctl > 0) "
                "needs trajectory.group_weight=tokens (cua_rl.deploy.check_kl_weight)."})
    entropy_bonus: float = field(default=0.0, metadata={
        "help": "The actor's loss minus this times the mean entropy of its trained tokens "
                "(cua_rl/areal_ext/entropy_bonus.py; 0 = off). The KL penalty is AReaL's actor.kl_ctl; with "
                "kl_ctl > 0 and no ref section the reference is the actor's starting weights "
                "(cua_rl.deploy.reference_model)."})

    # --- evaluation
    baseline_eval: bool = field(default=False, metadata={
        "help": "Evaluate the base model on the eval split once before the first step (the monitor shows it as the "
                "run's baseline); skipped on resume and without an eval split."})

    # --- Training Monitor
    monitor_base_url: str = field(default="", metadata={
        "help": "Training Monitor URL; nothing is sent while empty (the embedded stack starts ours)."})
    project_id: str = field(default="", metadata={"help": "Training Monitor project the run is filed under."})
    project_token: str = field(default="", metadata={
        "help": "Training Monitor token; prefer the PROJECT_TOKEN environment variable (the launcher never saves "
                "a token into a config)."})

    # --- the run
    existing_run: str = field(default="refuse", metadata={
        "help": "What to do when an explicit trial_name's run exists: refuse, overwrite (its logs and checkpoints "
                "deleted first) or resume (train.sh --resume: from its last committed recover point, "
                "cua_rl/trainer/resume.py; with trial_name auto, the newest run). trial_name auto names each run "
                "run<YYYYmmdd_HHMMSS>, so runs never share logs or checkpoints.",
        "choices": list(EXISTING_RUN)})

    # --- sections
    vllm: CUAvLLMConfig = field(default_factory=CUAvLLMConfig, metadata={
        "help": "AReaL's vLLM settings plus logprobs_mode (cua_rl/areal_ext/vllm_config.py)."})
    policy: EndpointSettings = field(default_factory=EndpointSettings, metadata={
        "help": "The policy endpoint's settings (cua_rl/policy/endpoint.py EndpointSettings)."})
    embedded: EmbeddedStackConfig = field(default_factory=EmbeddedStackConfig, metadata={
        "help": "The embedded stack started without a gym URL: gym, agent service, monitor, tiny model."})
    task_source: TaskSourceConfig = field(default_factory=TaskSourceConfig, metadata={
        "help": "Where the training tasks come from (cua_rl/dataset.py); unused when task_sources is set."})
    task_sources: list[TaskSourceConfig] = field(default_factory=list, metadata={
        "help": "Several training sources combined (each with its own filters, limit, seed, gym and weight); when "
                "set, task_source is not used."})
    eval_task_source: TaskSourceConfig | None = field(default=None, metadata={
        "help": "The eval tasks from a source of their own (every task it gives, after its filters and limit); the "
                "training sources are then not split (all of theirs train)."})
    trajectory: TrajectoryConfig = field(default_factory=TrajectoryConfig, metadata={
        "help": "How recorded turns become training rows (cua_rl/trajectory/config.py)."})
    sft: SFTConfig = field(default_factory=SFTConfig, metadata={
        "help": "The SFT warm start on scripted demonstrations (cua_rl/sft)."})
    health: HealthConfig = field(default_factory=HealthConfig, metadata={
        "help": "Per-step health checks: what an anomaly does (--on-anomaly) and thresholds "
                "(cua_rl/trainer/health.py)."})
    gym_fleet: GymFleetConfig = field(default_factory=GymFleetConfig, metadata={
        "help": "Several gym hosts in one run: health checks and our gyms on a Ray cluster's nodes."})
    verdict: VerdictConfig = field(default_factory=VerdictConfig, metadata={
        "help": "The verdict on learning at the end of a run (cua_rl/verdict.py)."})
    tree: TreeConfig = field(default_factory=TreeConfig, metadata={
        "help": "Tree groups on forked desktops instead of plain GRPO groups (cua_rl/workflow/tree.py)."})

    def _check_tree(self) -> None:
        """What tree groups need of the rest of the config (the gym's fork route and the agent's ``startFrom``
        are asked of the services when the first tree plays)."""
        if self.tree.branch_turns[-1] > self.max_turns:
            raise ValueError(f"tree.branch_turns {self.tree.branch_turns} reach past max_turns ({self.max_turns})")
        if len(self.gym_urls) > 1 or self.task_sources or self.gym_fleet.ray_gyms.enabled:
            raise ValueError("tree groups play on one gym host (a fork's children live on their parent's host): "
                             "give one gym URL and one task source")
        if self.trajectory.shuffle_screenshots or self.trajectory.mutation:
            raise ValueError("tree groups have no screenshot-swap control or mutations (trajectory.shuffle_screenshots, "
                             "trajectory.mutation); trajectory.shuffle_rewards shuffles their leaves' rewards")

    def __post_init__(self):
        super().__post_init__()
        self.gym_base_url = gym_spec(self.gym_base_url)
        if self.gym_fleet.ray_gyms.enabled:
            if self.scheduler.type != "ray":
                raise ValueError(f"gym_fleet.ray_gyms.enabled starts gyms on the Ray cluster's nodes: it needs "
                                 f"scheduler.type=ray (got {self.scheduler.type!r})")
            self.gym_id = self.gym_id or self.embedded.gym_id   # what they serve (and a named gym must serve too)
        for name in ("max_turns", "max_task_time_seconds", "max_turn_time_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.tree.enabled:
            self._check_tree()
        if not 0.0 <= self.gym_train_ratio <= 1.0:
            raise ValueError(f"gym_train_ratio must be within [0, 1], got {self.gym_train_ratio}")
        if self.existing_run not in EXISTING_RUN:
            raise ValueError(f"existing_run must be one of {EXISTING_RUN}, got {self.existing_run!r}")
        if self.existing_run == "resume" and self.recover.mode in ("disabled", "off"):
            raise ValueError(f"existing_run=resume needs recover.mode on (got {self.recover.mode!r})")
        if self.gym_split_type not in SPLIT_TYPES:
            raise ValueError(f"gym_split_type must be one of {SPLIT_TYPES}, got {self.gym_split_type!r}")
        if self.gym_limit is not None and self.gym_limit <= 0:
            raise ValueError(f"gym_limit must be positive or null, got {self.gym_limit}")
        if self.gym_seed < 0:
            raise ValueError(f"gym_seed must be >= 0, got {self.gym_seed}")
        for name in ("train_dataset", "valid_dataset"):
            dataset = getattr(self, name, None)
            if dataset is not None and dataset.batch_size < 1:
                raise ValueError(f"{name}.batch_size must be >= 1, got {dataset.batch_size}")
        in_flight = self.rollout.max_concurrent_rollouts
        if in_flight is not None and in_flight < 1:
            raise ValueError(f"rollout.max_concurrent_rollouts must be >= 1 or null, got {in_flight}")
        if self.gym_eval_number_range:
            try:
                parse_number_ranges(self.gym_eval_number_range)  # fail at load time, not mid-run
            except ValueError as exc:
                raise ValueError(f"gym_eval_number_range: {exc}") from None
        if self.model_base_url:
            raise ValueError(f"model_base_url {self.model_base_url!r} (--model-base-url): a training run's agent calls "
                             f"this run's policy endpoint, served by AReaL (vLLM in its rollout workers), which "
                             f"records every turn it trains on; an agent sent to another model trains nothing, so "
                             f"the key is refused. Drop it (the example's vLLM flags map to vllm.* keys: README, "
                             f"'Coming from AReaL's cua_agent example'); to evaluate a model you serve yourself, "
                             f"use cua-eval --model-url URL")
        if self.agent_service not in ("external", "embedded"):
            raise ValueError(f"agent_service must be external or embedded, got {self.agent_service!r}")
        if self.embedded_enabled and self.gym_id and self.gym_id not in EMBEDDED_GYM_IDS:
            raise ValueError(f"gym_id {self.gym_id!r}: the embedded gym serves {' or '.join(EMBEDDED_GYM_IDS)}; "
                             f"another gym id needs its gym's URL (--gym URL)")
        if not (math.isfinite(self.entropy_bonus) and self.entropy_bonus >= 0):
            raise ValueError(f"entropy_bonus must be a number >= 0, got {self.entropy_bonus}")
        if isinstance(self.gym_tags, str):  # tolerate "easy,normal" from hand-written YAML
            self.gym_tags = [t.strip() for t in self.gym_tags.split(",") if t.strip()]
        for tag in self.gym_tags or []:
            if not _TAG.match(str(tag)):
                raise ValueError(f"gym_tags: bad tag {tag!r} (letters, digits, _ . : - only)")
        deploy.apply(self)   # AReaL's sections checked against ours (cua_rl/deploy.py)

    # --- small derived values, so callers do not repeat the rules
    @property
    def embedded_gym_id(self) -> str:
        """The embedded gym's id: ``gym_id`` when given (``--gym-id miniwob`` without ``--gym``), else
        ``embedded.gym_id``."""
        return self.gym_id or self.embedded.gym_id

    def custom_tasks(self) -> list[dict]:
        """Every task written in the config (sources of kind custom: task_source, task_sources, eval_task_source),
        for the embedded gym to serve (the launcher refuses them with any other gym)."""
        sources = [self.task_source, *self.task_sources, *([self.eval_task_source] if self.eval_task_source else [])]
        seen, out = set(), []
        for source in sources:
            for task in source.custom_tasks():
                key = (str(task.get("number")), task.get("name"))
                if key not in seen:
                    seen.add(key)
                    out.append(task)
        return out

    def external_services(self) -> list[tuple[str, str]]:
        """(setting name, URL) of every service the rollout workers call: each gym host, then the agent service."""
        return [*(("gym_base_url", url) for url in self.gym_urls),
                ("gbox_mini_agent_base_url", self.gbox_mini_agent_base_url)]

    @property
    def gym_urls(self) -> list[str]:
        """The run's gym hosts (``gym_base_url`` as a list; empty for the embedded gym)."""
        return parse_gym_urls(self.gym_base_url)

    @property
    def embedded_enabled(self) -> bool:
        """Whether launch.py starts the embedded stack: no gym named and none started on Ray, unless forced."""
        if self.embedded.enabled is None:
            return not self.gym_base_url and not self.gym_fleet.ray_gyms.enabled
        return self.embedded.enabled


# Hydra's schema of every config: config.yaml's defaults list starts from it (``defaults: [cua_rl_config, _self_]``),
# so Hydra knows every field of CUAConfig, AReaL's included, and any of them is set on the command line as a plain
# ``key=value``, whether the YAML lists it or not (without it, Hydra refused a key the YAML lacked unless written
# ``+key=value``). Registered when this module is imported, which every loader of a CUAConfig does (AReaL's
# ``load_expr_config(argv, CUAConfig)`` is handed the class); entries of an open mapping (``health.thresholds``)
# are new keys and still take '+'.
SCHEMA = "cua_rl_config"


def _register_schema() -> None:
    """Every key with its default, as plain values: Hydra then knows each key, while the types are checked where
    they were before, when AReaL merges the composed config into CUAConfig (a typed node would refuse to take a
    whole section for an optional one that is null, e.g. ``eval_task_source={tags: [test]}``)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.structured(CUAConfig), resolve=False, enum_to_str=True)
    ConfigStore.instance().store(name=SCHEMA, node=OmegaConf.create(defaults))


_register_schema()


def hydra_overrides(args: list[str]) -> list[str]:
    """Command-line arguments with each single leading '+' made '++' (Hydra's add-or-override). With the schema
    every field is in the config, and Hydra refuses '+key=value' for a key that has a value: commands written
    when a key missing from the YAML needed '+' keep working. Every loader of ours passes its arguments
    through this."""
    return ["+" + a if a.startswith("+") and not a.startswith("++") and "=" in a else a for a in args]








def resolve_project_token(config: CUAConfig, environ: dict | None = None) -> str:
    """Monitor token: the config value, else PROJECT_TOKEN, else MONITOR_PROJECT_TOKEN."""
    from cua_rl.monitor import token_from_env

    return config.project_token or token_from_env(environ)


def resolve_tiny_model_dir(config: CUAConfig, environ: dict | None = None) -> str:
    """Directory of the tiny offline model used by the embedded CPU stack."""
    if config.embedded.tiny_model_dir:
        return os.path.expanduser(config.embedded.tiny_model_dir)
    from cua_rl import cua_rl_home

    return os.path.join(cua_rl_home(environ), "models", "tiny-qwen3-vl")
