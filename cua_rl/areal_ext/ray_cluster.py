"""Training under AReaL's Ray scheduler (``scheduler.type=ray``): attach to the cluster, equip its workers.

Why: AReaL's Ray scheduler never starts or joins a cluster itself, and every worker it makes is AReaL's own
Ray actor, started by the raylet: not our worker command (so none of cua_rl/areal_ext/worker.py's patches:
wrong packed logprobs on the CPU, no sampler-gap statistic) and not the trainer's environment (so vLLM on a
CPU node gets its 4 GiB default KV cache and AReaL's awex plugin, the workers no monitor token). Here the
trainer joins the cluster the user started (``ray start --head`` on this node, or ``RAY_ADDRESS``) with a
job-wide runtime environment: ``worker.ray_setup`` as Ray's ``worker_process_setup_hook`` (run in every
worker process before its actor is built) and the variables below. The scheduler also gets a longer start-up
wait than AReaL's fixed 30 s: a worker that imports torch and AReaL on a busy node takes longer.

What crosses to the workers, by name: ``FORWARD_NAMES`` and everything starting with ``FORWARD_PREFIXES``
(vLLM's and this project's settings, the Hugging Face, tokenizer and W&B variables, the monitor's, the gym and agent
tokens: a token given as a file is forwarded as its value). They sit
in Ray's job record, readable by whoever can read the cluster's (docs/cluster.md). Everything else a worker
sees is the environment of the shell that ran ``ray start`` on its node.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from areal.api.cli_args import BaseExperimentConfig


logger = logging.getLogger("cua-rl.ray")

FORWARD_PREFIXES = ("CUA_RL_", "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "WANDB_", "TORCHDYNAMO_")
FORWARD_NAMES = ("MONITOR_BASE_URL", "PROJECT_ID", "PROJECT_TOKEN", "CUA_GYM_TOKEN", "CUA_AGENT_TOKEN")
# Tokens given as files are forwarded as their values (a path on this node means nothing on another)
TOKEN_NAMES = ("CUA_GYM_TOKEN", "CUA_AGENT_TOKEN")
SETUP_HOOK = "cua_rl.areal_ext.worker.ray_setup"
# AReaL waits this long for a placement group and each worker's first answer (its default: 30 s)
STARTUP_TIMEOUT_S = 300.0
CONNECT_TIMEOUT_S = 10.0
START_HINT = ("ray start --head --num-cpus=N --num-gpus=G --memory=BYTES (with the Python environment "
              "that trains: its `ray` command), or set RAY_ADDRESS to a running cluster; docs/cluster.md")


def worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The trainer's variables that its Ray workers get (see the module docstring)."""
    from cua_rl.http.auth import token_from_env

    forwarded = {name: value for name, value in environ.items()
                 if name in FORWARD_NAMES or name.startswith(FORWARD_PREFIXES)}
    for name in TOKEN_NAMES:
        token = token_from_env(name, environ)
        if token:
            forwarded[name] = token
    return forwarded


def connect(environ: Mapping[str, str] = os.environ) -> int:
    """Join the Ray cluster at ``RAY_ADDRESS`` (default: the one started on this node) as this run's job;
    the number of its live nodes."""
    import ray

    if ray.is_initialized():
        return _live_nodes()
    address = environ.get("RAY_ADDRESS") or "auto"
    _reachable(address)
    try:
        ray.init(address=address, runtime_env={"worker_process_setup_hook": SETUP_HOOK,
                                               "env_vars": worker_env(environ)})
    except ConnectionError as exc:
        raise SystemExit(f"scheduler.type=ray: no Ray cluster at {address} ({exc}); start one first: "
                         f"{START_HINT}") from None
    resources, nodes = ray.cluster_resources(), _live_nodes()
    logger.info("joined the Ray cluster at %s: %d node(s), %s CPU, %s GPU, %.1f GiB of memory", address, nodes,
                resources.get("CPU", 0), resources.get("GPU", 0), resources.get("memory", 0) / 2**30)
    return nodes


def _live_nodes() -> int:
    import ray

    return len([n for n in ray.nodes() if n.get("Alive")])


def _reachable(address: str) -> None:
    """Fail at once, naming the address, when nobody listens there: ``ray.init`` retries an unreachable
    cluster for over ten minutes before it gives up (measured here: 13.7 min for a closed port)."""
    import socket

    from ray._private.services import canonicalize_bootstrap_address

    try:
        resolved = canonicalize_bootstrap_address(address)   # "auto": the cluster `ray start` left on this node
    except ConnectionError:
        resolved = None
    if resolved is None:
        raise SystemExit(f"scheduler.type=ray: no Ray cluster found on this node (RAY_ADDRESS unset); start one "
                         f"first: {START_HINT}")
    host, _, port = resolved.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise SystemExit(f"scheduler.type=ray: nothing answers at the Ray cluster's address {resolved} "
                         f"({'RAY_ADDRESS' if address != 'auto' else 'the last `ray start` on this node'}): {exc}; "
                         f"start one first: {START_HINT}") from None


def scheduler(config: BaseExperimentConfig, services: list[tuple[str, str]], monitor_url: str):
    """AReaL's RayScheduler for AReaL's ``config``, on the cluster ``connect`` joined, once the run's external
    services (setting name, URL) and monitor are reachable from every node (``check_addresses``)."""
    from areal.infra.scheduler.ray import RayScheduler

    check_addresses(services, monitor_url, connect())
    return RayScheduler(startup_timeout=STARTUP_TIMEOUT_S, exp_config=config)


def check_addresses(services: list[tuple[str, str]], monitor_url: str, nodes: int) -> None:
    """On a cluster of several nodes the rollout workers may run on any of them, and a loopback URL there is
    that node's own: the embedded gym and agent (started beside the launcher on 127.0.0.1) or a gym or agent
    given as localhost would be unreachable and every episode lost. Refused before any worker starts; a
    loopback monitor only loses the workers' records, so it is a warning. ``services``: (setting name, URL), every
    host of a gym fleet under its one name (``CUAConfig.external_services``)."""
    if nodes < 2:
        return
    from urllib.parse import urlsplit

    from cua_rl.http.auth import is_loopback  # one rule for "this machine only"

    local = [(name, url) for name, url in services if url and is_loopback(urlsplit(url).hostname or "")]
    if local:
        raise SystemExit(
            f"scheduler.type=ray on {nodes} nodes: {', '.join(f'{k}={v}' for k, v in local)} is this "
            "node's loopback, which rollout workers on the other nodes cannot reach (the embedded stack and "
            "--agent embedded serve there). Give routable URLs (--gym, --gbox-mini-url) with services of your "
            "own, or run on one node; docs/cluster.md")
    monitor = monitor_url
    if monitor and is_loopback(urlsplit(monitor).hostname or ""):
        logger.warning("scheduler.type=ray on %d nodes: the Training Monitor at %s is this node's loopback; "
                       "rollout workers on other nodes cannot send it their records (docs/cluster.md)",
                       nodes, monitor)
