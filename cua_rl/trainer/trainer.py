"""``Trainer``: AReaL's ``PPOTrainer`` with this project's start-up and between-step additions, and the helpers
``cua_rl.train`` composes around it (the monitor's update reporter, the stall watch, the baseline evaluation,
a bounded close after a failure).

Everything here that reaches into AReaL's private names lives in this one module, so an AReaL upgrade
breaks here first: ``_init_scheduler``, ``_create_train_engine``, ``_init_rollout``,
``_should_offload_rollout``, ``_evaluate_fn`` and the local scheduler's ``_allocate_ports``,
``_allocate_gpus`` and ``_release_ports``. The run's own logic it calls sits beside it: ``health``,
``resume``, ``weight_probe``, ``warm_up``, ``model_watch``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING

from areal import PPOTrainer
from areal.utils import logging

from cua_rl.runs import RunPaths
from cua_rl.trainer.health import Health, StallWatch, UnhealthyRun, log_stop
from cua_rl.trainer.model_watch import server_addrs
from cua_rl.trainer.progress import StepProgress
from cua_rl.trainer.warm_up import warm_up

if TYPE_CHECKING:   # the sections the run hands over (defined by cua_rl.config, above this room)
    from areal.api.cli_args import GRPOConfig

    from cua_rl.config import EmbeddedStackConfig
    from cua_rl.genv.fleet_config import RayGymsConfig
    from cua_rl.trainer.health import HealthConfig
from cua_rl.trainer.weight_probe import WeightProbe, adapter_probe, fingerprint, real_update

logger = logging.getLogger("cua-train")
# How long a failed run's close may take (Trainer.__exit__): AReaL's own close takes seconds.
CLOSE_AFTER_FAILURE_S = 120
CLOSE_ABANDONED = threading.Event()


@contextlib.contextmanager
def stall_watch(trainer: "Trainer", config: GRPOConfig, group_size: int):
    """The health checks' watch between steps (cua_rl/trainer/health.py ``StallWatch``) while the body runs."""
    watch = StallWatch(RunPaths.of(config).logs, trainer.health,
                       episodes_per_step=config.train_dataset.batch_size * group_size,
                       on_finding=lambda f: trainer.report_update(f.step, {}, [f]))
    trainer.stall_watch = watch.start()
    try:
        yield watch
    finally:
        trainer.stall_watch = None
        watch.stop()


@contextlib.contextmanager
def ray_gyms(options: RayGymsConfig, embedded: EmbeddedStackConfig, gym_id: str, log_dir: str):
    """``start()``: our gyms started on the Ray cluster's nodes (``gym_fleet.ray_gyms``; cua_rl/areal_ext/ray_gyms.py),
    their URLs ([] when off); call it once AReaL's workers are placed. They are ended when this context ends:
    enter it before the ``Trainer``, so AReaL's close ends the rollout workers (the next step's episodes still
    play on these gyms at the end of a run) before their gyms go. Ended first, the gyms were drained by the
    rollout worker's fleet as failed hosts and a group was dropped and played again during the close. On entry
    (before the trainer joins the Ray cluster, whose job-wide environment carries it to every worker) the run's gym
    token is made when the user gave none: the Ray gyms serve on their nodes' addresses."""
    started = []
    if options.enabled:
        from cua_rl.areal_ext.ray_gyms import ensure_gym_token

        ensure_gym_token()

    def start() -> list[str]:
        if not options.enabled:
            return []
        from cua_rl.areal_ext.ray_gyms import RayGyms

        started.append(RayGyms.start(options, embedded, gym_id, log_dir))
        return list(started[-1].urls)

    try:
        yield start
    finally:
        for gyms in started:
            gyms.stop()


@contextlib.contextmanager
def update_reporter(monitor_url: str, project_id: str, token: str, training_id: int | None):
    """``report(train_step, stats, findings)``: each update's statistics and health to the Training Monitor's
    step row of the rollouts it trained (the run page draws them), sent from a daemon thread; a no-op when
    the monitor is off (``training_id`` None)."""
    if training_id is None:
        yield lambda train_step, stats, findings: None
        return
    from cua_rl.monitor.client import MonitorClient
    from cua_rl.monitor.records import update_record
    from cua_rl.monitor.sender import RecordSender

    sender = RecordSender(lambda: MonitorClient.from_settings(monitor_url, token, project_id, raise_errors=True),
                          what="update statistics")

    last: dict = {}

    def report(train_step: int, stats: dict, findings: list) -> None:
        if last.get("step") == train_step:   # a check after the commit (the weight probe): keep what was sent
            stats, findings = {**last["stats"], **stats}, [*last["findings"], *findings]
        last.update(step=train_step, stats=stats, findings=findings)
        health = {k.removeprefix("health/"): v for k, v in stats.items()
                  if k.startswith("health/") and k != "health/anomalies"}
        # step k turns version k-1 into k: mostly the rollouts sampled at version k-1 (the monitor's step row)
        sender.submit([update_record(training_id, max(train_step - 1, 0), train_step=train_step, stats=stats,
                                     health=health, anomalies=[f.as_dict() for f in findings])])

    try:
        yield report
    finally:
        sender.close()


class Trainer(PPOTrainer):
    """AReaL's PPOTrainer with start-up changes, none touching training itself:

    - The run's health after every step (cua_rl/trainer/health.py): ``health/*`` values join the step's
      statistics, a tripped check prints one line, and one that means garbage stops the run once the step's
      statistics are committed (its recover point is already written).
    - One line per trained step and a line of ``metrics.jsonl`` (cua_rl/trainer/progress.py): the raw success
      and reward of the episodes the step trained, read from its batch; ``trained/*`` join its statistics.
    - Under Ray, the cluster joined with our workers' patches and environment (``_init_scheduler``).
    - No evaluation rollout when there is nothing to evaluate. AReaL builds one whether or not a valid
      dataset is given: on the single controller that is one more RPC worker process (torch and AReaL
      imported again) during start-up. Every use of ``eval_rollout`` in AReaL's trainer checks it for None.
    - The inference side starts beside the training engine instead of after it. AReaL initialises the actor
      (its worker imports torch and AReaL, then builds the model: 15 s on a CPU, minutes for a large model on
      a GPU) and only then starts the rollout worker and vLLM; each uses one core at a time while its turn
      lasts. Here the rollout controller is initialised in a thread while the actor is, when that is safe:
      AReaL's local scheduler (its port and GPU allocation made atomic below), actor and rollout not
      colocated, no LoRA (the rollout is started with the actor's initial adapter). On the CPU stack vLLM
      then serves about 13 s sooner. Nothing between the two in AReaL's ``__init__`` reads the rollout.
    """

    def __init__(self, config: GRPOConfig, train_dataset, valid_dataset=None, *, health: HealthConfig,
                 max_turns: int, services: list[tuple[str, str]] = (), monitor_url: str = "", **kwargs):
        """AReaL's config (AReaL's API) and, beside it, what this trainer reads of ours: the health checks'
        section, the turn limit, and the run's external services (setting name, URL) with the monitor's URL,
        which a Ray cluster of several nodes must reach (``ray_cluster.check_addresses``)."""
        self._services, self._monitor_url = list(services), monitor_url
        self._needs_eval_rollout = valid_dataset is not None
        self._early_rollout: _Background | None = None
        self.stall_watch: StallWatch | None = None
        self.report_update = lambda train_step, stats, findings: None   # update_reporter's, when the monitor is on
        self.health = Health(health, max_turns=max_turns,
                             max_head_offpolicyness=config.rollout.max_head_offpolicyness)
        super().__init__(config, train_dataset=train_dataset, valid_dataset=valid_dataset, **kwargs)
        self._commit, self.stats_logger.commit = self.stats_logger.commit, self._commit_with_health
        self.progress = StepProgress(RunPaths.of(config).logs)
        prepare = self.actor.prepare_batch

        def prepare_and_note(*args, **kwargs):   # the batch the step trains, before AReaL clears its tensors
            batch = prepare(*args, **kwargs)
            self.progress.trained(batch)
            return batch

        self.actor.prepare_batch = prepare_and_note
        # after each update, whether the servers took it (cua_rl/trainer/weight_probe.py): probed once the
        # inference side resumes, since AReaL keeps the engines paused through the update and the commit. With
        # LoRA the probe reads the adapter of the version served; not with another model's server.
        self.weight_probe = (WeightProbe(lambda: server_addrs(self), self._probe_of(config))
                             if health.weight_probe else None)
        self._probe_due: tuple[int, bool] | None = None
        if self.weight_probe is not None and getattr(self, "rollout", None) is not None:
            resume = self.rollout.resume

            def resume_and_probe(*args, **kwargs):
                out = resume(*args, **kwargs)
                self._check_weights()
                return out

            self.rollout.resume = resume_and_probe
        # the servers' first image request now, not in the first step's episodes (cua_rl/trainer/warm_up.py)
        warm_up(server_addrs(self))

    def _probe_of(self, config: GRPOConfig):
        """The weight probe's fingerprint: the base model's, or with LoRA the served version's adapter's."""
        if not config.actor.use_lora:
            return fingerprint
        return adapter_probe(config.gconfig.lora_name, lambda: self.rollout.get_version())

    def train(self, *args, total_epochs: int | None = None, **kwargs):
        refuse_dynamic_filter(*args, **kwargs)
        if self.weight_probe is not None:
            self.weight_probe.baseline()
        self.progress.start(*self._steps(total_epochs))
        return super().train(*args, total_epochs=total_epochs, **kwargs)

    def _steps(self, total_epochs: int | None) -> tuple[int, int]:
        """(the run's last step, the global step training starts at), as AReaL's ``train`` counts them."""
        steps = (total_epochs or self.config.total_train_epochs) * len(self.train_dataloader)
        if self.config.total_train_steps is not None:
            steps = min(steps, self.config.total_train_steps)
        start = self.recover_info.last_step_info.next().global_step if self.recover_info is not None else 0
        return steps, start

    def _check_weights(self) -> None:
        """The ``weights_unchanged`` check of the update committed last (see ``__init__``)."""
        if self._probe_due is None:
            return
        step, real = self._probe_due
        self._probe_due = None
        measured = self.weight_probe.after_update(real)
        if measured is None:
            return
        unchanged, compared = measured
        finding = self.health.judge(step, "weights_unchanged", float(unchanged),
                                    note=f"{unchanged} of {compared} servers after the update to version {step}")
        if finding is None:
            return
        print(finding.line(), flush=True)
        self.report_update(step, {}, [finding])
        if finding.action == "stop":
            log_stop(step, [finding])
            raise UnhealthyRun([finding])

    def __exit__(self, exc_type, exc_value, traceback):
        """AReaL's close, bounded after a failure. Its close pauses and stops the inference engines; when the
        failure is an engine that stopped answering (vLLM's multimodal cache desync hung one: every request
        failed, then the weight update's pause timed out after 600 s), those calls wait forever and the run
        sits printing nothing. After ``CLOSE_AFTER_FAILURE_S`` the close is left to itself; ``run`` then ends
        the process with the failure's exit code, and the launcher ends the run's process group."""
        if exc_type is None:
            return super().__exit__(exc_type, exc_value, traceback)
        closing = threading.Thread(target=super().__exit__, args=(exc_type, exc_value, traceback),
                                   name="areal-close", daemon=True)
        closing.start()
        closing.join(CLOSE_AFTER_FAILURE_S)
        if closing.is_alive():
            logger.error("AReaL's shutdown after the failure has not finished in %d s (an inference engine that "
                         "no longer answers); leaving it: the run's processes are ended instead",
                         CLOSE_AFTER_FAILURE_S)
            CLOSE_ABANDONED.set()
        return False

    def _commit_with_health(self, epoch: int, epoch_step: int, global_step: int, stats: dict) -> None:
        """AReaL's ``stats_logger.commit`` with the trained episodes' outcome and the health checks before it, and
        the step's line and the checks' verdict after it."""
        stats = {**stats, **self.progress.stats()}
        findings = self.health.observe(global_step + 1, stats)
        self._commit(epoch, epoch_step, global_step, stats)
        print(self.progress.committed(global_step, stats), flush=True)
        self.report_update(global_step + 1, stats, findings)
        optimizer = self.config.actor.optimizer
        self._probe_due = (global_step + 1, real_update(stats, optimizer.type, optimizer.gradient_clipping))
        for finding in findings:
            print(finding.line(), flush=True)
        stops = [f for f in findings if f.action == "stop"]
        if stops:
            log_stop(global_step + 1, stops)
            raise UnhealthyRun(stops)
        if self.stall_watch is not None:
            self.stall_watch.step_done(global_step + 1)

    def _init_scheduler(self):
        """AReaL's, except Ray: joined with our workers' set-up (cua_rl/areal_ext/ray_cluster.py). The ports it
        picks for workers come from the operating system's randomness, not the run's seed
        (cua_rl/areal_ext/ports.py)."""
        from cua_rl.areal_ext import ports

        ports.enable()
        if self.config.scheduler.type == "ray":
            from cua_rl.areal_ext import ray_cluster

            return ray_cluster.scheduler(self.config, self._services, self._monitor_url)
        return super()._init_scheduler()

    def _overlap_start(self) -> bool:
        from areal.infra.scheduler.local import LocalScheduler

        return (isinstance(self.scheduler, LocalScheduler) and not self._should_offload_rollout
                and not self.config.actor.use_lora)

    def _create_train_engine(self, actor_config, alloc):
        engine = super()._create_train_engine(actor_config, alloc)
        if actor_config is self.config.actor and self._overlap_start():
            _atomic_allocation(self.scheduler)
            initialize = engine.initialize

            def initialize_beside_the_rollout(*args, **kwargs):
                self._early_rollout = _Background(
                    "rollout-init", lambda: PPOTrainer._init_rollout(self, self.config.rollout, is_eval=False))
                return initialize(*args, **kwargs)

            engine.initialize = initialize_beside_the_rollout
        return engine

    def _init_rollout(self, rollout_config, is_eval: bool = False, lora_path: str | None = None):
        if is_eval and not self._needs_eval_rollout:
            logger.info("no eval split: no evaluation rollout is started")
            return None
        if not is_eval and self._early_rollout is not None:
            return self._early_rollout.result()
        return super()._init_rollout(rollout_config, is_eval=is_eval, lora_path=lora_path)


def refuse_dynamic_filter(*args, **kwargs) -> None:
    """``PPOTrainer.train``'s ``dynamic_filter_fn`` (its fifth argument) drops groups the workflow never hears
    of: their stream items would never be recorded as consumed (``cua_rl.runs.record_dropped``) and would pin
    the resume point. The workflow drops zero-signal groups itself and records them."""
    if kwargs.get("dynamic_filter_fn") is not None or (len(args) > 4 and args[4] is not None):
        raise ValueError("dynamic_filter_fn is refused: AReaL would drop those groups without recording their "
                         "stream items for resume; set trajectory.drop_zero_variance=true to drop groups whose "
                         "rewards are all equal (the workflow records each one)")


class _Background:
    """A call run in a daemon thread (a failed start-up exits without waiting for it); ``result()`` joins it
    and returns its value or raises its exception."""

    def __init__(self, name: str, call) -> None:
        self._value, self._error = None, None

        def run() -> None:
            try:
                self._value = call()
            except BaseException as e:   # re-raised in the caller's thread
                self._error = e

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def _atomic_allocation(scheduler) -> None:
    """AReaL's local scheduler picks ports and GPUs by reading, then updating, its own records; two roles
    created at once must not both read before either updates."""
    lock = threading.Lock()
    for name in ("_allocate_ports", "_allocate_gpus", "_release_ports"):
        method = getattr(scheduler, name)

        def locked(*args, _method=method, **kwargs):
            with lock:
                return _method(*args, **kwargs)

        setattr(scheduler, name, locked)


def evaluate_baseline(trainer: Trainer, eval_workflow: str, eval_workflow_kwargs: dict) -> None:
    """The eval split once with the base model (policy version 0, so the monitor files it as the baseline).
    AReaL's evaluator only runs after steps; its evaluation body (``_evaluate_fn``) is called directly, and
    its statistics are taken out here so they do not mix into step 1's."""
    logger.info("baseline: evaluating the base model on the eval split before training")
    trainer._evaluate_fn(eval_workflow=eval_workflow, eval_workflow_kwargs=eval_workflow_kwargs)
    stats = trainer.eval_rollout.export_stats()
    shown = {}
    for key, value in stats.items():
        parts = key.split("/")
        name = parts[-2] if parts[-1] == "avg" and len(parts) > 1 else parts[-1]
        if name in ("reward", "task_success", "num_turns"):
            shown[name] = value
    logger.info("baseline (policy version 0): %s",
                ", ".join(f"{k} {v:.3f}" for k, v in sorted(shown.items())) or "no episode finished")


def run(entry) -> None:
    """``entry()``. A failure whose close was left unfinished (``Trainer.__exit__``) ends the process at once
    with its exit code: an orderly interpreter exit would wait for AReaL's non-daemon server threads."""
    try:
        entry()
    except BaseException as exc:
        if not CLOSE_ABANDONED.is_set():
            raise
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        if not isinstance(exc, SystemExit):
            import traceback

            traceback.print_exception(exc)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
