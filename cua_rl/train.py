"""GRPO training of a computer-use VLM agent on AReaL (shape of AReaL's examples/agent_workflow/train.py).

    python -m cua_rl.train --config examples/cua_agent/config.yaml [key=value ...]

Normally started by ``train.sh`` -> ``python -m cua_rl.run.launch``, which also starts the embedded gym and
agent service. AReaL's scheduler starts the workers (``cua_rl.areal_ext.worker``) and vLLM, on a GPU or a CPU.
This file only composes: the config, the datasets, the workflow and our trainer (``cua_rl.trainer``).
"""

import os
import signal
import sys
from dataclasses import asdict

from cua_rl.logs import setup_logging

setup_logging()  # before AReaL's imports start swapping the root logger

from areal.api.cli_args import load_expr_config
from areal.utils import logging

from cua_rl.areal_ext import entropy_bonus, lora_vlm
from cua_rl.config import CUAConfig, hydra_overrides, resolve_project_token
from cua_rl.dataset import load_task_datasets
from cua_rl.genv.fleet import join_gym_urls
from cua_rl.monitor import training_run
from cua_rl.runs import RunPaths
from cua_rl.trainer.health import UnhealthyRun, stop_requested
from cua_rl.trainer.model_watch import watch_model_servers
from cua_rl.trainer.resume import install, resume_point
from cua_rl.trainer.trainer import Trainer, evaluate_baseline, ray_gyms, run, stall_watch, update_reporter
from cua_rl.workflow import workflow_kwargs

logger = logging.getLogger("cua-train")


def wandb_environment(config: CUAConfig) -> None:
    """W&B follows ``stats_logger.wandb.mode``. AReaL's StatsLogger calls ``wandb.login()`` for any mode but
    "disabled", which fails without an API key even for an offline run; W&B's own offline mode
    (``WANDB_MODE=offline``) makes that login a no-op, so an offline run needs no account (``wandb sync`` later)."""
    if config.stats_logger.wandb.mode == "offline":
        os.environ["WANDB_MODE"] = "offline"


def main(args: list[str]) -> None:
    # The launcher stops a run with SIGTERM: unwind like Ctrl-C, so the trainer closes and the monitor run
    # is marked failed instead of staying "running".
    # A health check that stops the run between steps uses the same signal: exit code 3 then.
    signal.signal(signal.SIGTERM,
                  lambda signum, _frame: sys.exit(UnhealthyRun.CODE if stop_requested() else 128 + signum))
    config, _ = load_expr_config(hydra_overrides(args), CUAConfig)
    wandb_environment(config)
    # the training workers read these when they start (cua_rl/areal_ext/worker.py)
    os.environ[entropy_bonus.ENV] = repr(config.entropy_bonus)
    os.environ[lora_vlm.ENV] = "1" if config.actor.use_lora else "0"
    # Before the trainer is built: its recover handler loads whatever recover_info it finds, so the
    # directories must be back at the last committed point (or the run refused) first.
    point = resume_point(config) if config.existing_run == "resume" else None
    if point is not None:
        logger.info("resuming after step %d (policy version %d)", point.global_step + 1, point.global_step + 1)
    train_dataset, valid_dataset = load_task_datasets(config)

    # GRPO groups are run by the workflow itself (group-normalised rewards, see cua_rl/trajectory/groups.py),
    # so AReaL must not repeat each task n_samples times on top: it gets one "sample" per group.
    group_size, eval_group_size = config.gconfig.n_samples, config.eval_gconfig.n_samples
    config.gconfig = config.gconfig.new(n_samples=1)
    config.eval_gconfig = config.eval_gconfig.new(n_samples=1)

    logger.info("train tasks: %d, eval tasks: %d, group size: %d", len(train_dataset),
                0 if valid_dataset is None else len(valid_dataset), group_size)

    # Training Monitor (no-op without monitor_base_url + token). The token reaches rollout workers through
    # the environment only: workflow kwargs are logged and saved.
    token = resolve_project_token(config)
    if token:
        os.environ.setdefault("PROJECT_TOKEN", token)
        if config.monitor_base_url:  # the training workers send the trainer's logprobs per turn
            os.environ["MONITOR_BASE_URL"] = config.monitor_base_url
            os.environ["PROJECT_ID"] = config.project_id
    with training_run(config.monitor_base_url, config.project_id, config.experiment_name, config.trial_name,
                      token=token, enabled=int(os.environ.get("RANK", "0")) == 0,
                      config=asdict(config)) as training_id, \
            ray_gyms(config.gym_fleet.ray_gyms, config.embedded, config.gym_id,
                     str(RunPaths.of(config).logs)) as start_ray_gyms, \
            Trainer(config, train_dataset=train_dataset, valid_dataset=valid_dataset, health=config.health,
                    max_turns=config.max_turns, services=config.external_services(),
                    monitor_url=config.monitor_base_url) as trainer:
        # gyms started on the Ray cluster's spare CPUs once AReaL's workers are placed join the fleet (and end
        # after the Trainer's close)
        config.gym_base_url = join_gym_urls([*config.gym_urls, *start_ray_gyms()])
        train_kwargs = workflow_kwargs(config, config.gconfig, group_size, monitor_training_id=training_id)
        eval_kwargs = workflow_kwargs(config, config.eval_gconfig, eval_group_size, is_eval=True,
                                      monitor_training_id=training_id)
        with update_reporter(config.monitor_base_url, config.project_id, token, training_id) as trainer.report_update:
            # atomic recover dumps; each stream item trained (or dropped) once (cua_rl/trainer/resume.py)
            install(trainer, point, RunPaths.of(config).logs)
            if point is not None and trainer.recover_info is None:
                raise SystemExit(f"--resume: AReaL did not load the recover point in {point.root}")
            # a dead model server stops the run with its cause instead of a wait for batches that never come
            with watch_model_servers(trainer), stall_watch(trainer, config, group_size):
                if config.baseline_eval and valid_dataset is not None and trainer.recover_info is None:
                    evaluate_baseline(trainer, config.eval_workflow, eval_kwargs)
                trainer.train(
                    workflow=config.workflow,
                    workflow_kwargs=train_kwargs,
                    eval_workflow=config.eval_workflow if valid_dataset is not None else None,
                    eval_workflow_kwargs=eval_kwargs if valid_dataset is not None else None,
                )


if __name__ == "__main__":
    from cua_rl.run.prewarm import FLAG, read_hand_over

    # started early by the launcher (cua_rl/run/prewarm.py): the imports above are done; now the arguments
    run(lambda: main(read_hand_over() if sys.argv[1:] == [FLAG] else sys.argv[1:]))
