"""Our gym server on the Ray cluster's nodes (``gym_fleet.ray_gyms.enabled`` with ``scheduler.type=ray``): one
Ray actor per node with spare CPUs, each running ``cua-gym serve`` on its node's address; their URLs join the
run's fleet of gym hosts (cua_rl/genv/fleet.py), and they end with the run.

Why: a cluster's nodes are where the CPUs are. A GPU node's cores mostly idle while its GPUs train, and a CPU
node added to the cluster is a gym host without any set-up of its own: Ray already runs our environment there.

When: after AReaL has placed its workers (``Trainer``'s scheduler joined the cluster and created the actor and
the rollout workers), so what Ray still has free on a node is spare. A node gets ``floor(free CPUs /
cpus_per_desktop)`` executions (``--max-executions``), at most ``max_per_node``, and no gym below
``min_per_node``; its actor takes those CPUs from Ray (``num_cpus``), so nothing Ray places later counts on
them. Ray has no public call for one node's free resources: ``ray._private.state`` answers it (Ray 2.x).

Each actor starts the gym as a child process (its own mount namespace, as ``cua-gym serve`` always runs: the
desktops' HOME mounts end with it), which dies with the actor (PR_SET_PDEATHSIG), and answers the gym's URL
once ``/health`` answers. Each gym serves on the node's network address, so it needs the run's gym token: the actor
hands the ``CUA_GYM_TOKEN`` of its environment (the run's job-wide Ray environment: ``ensure_gym_token`` makes one
before the trainer joins the cluster; ``ray_cluster.worker_env`` forwards it, so the rollout workers send it too) to
``cua-gym serve`` through the child's environment, never its command line. ``RayGyms.stop`` ends each gym (SIGTERM:
every desktop ended) and its actor; a driver that dies takes its actors, and so their gyms, with it (Ray ends a
job's actors).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the run's sections (cua_rl.config, above this room)
    from cua_rl.config import EmbeddedStackConfig
    from cua_rl.genv.fleet_config import RayGymsConfig

logger = logging.getLogger("cua-rl.ray")
READY_TIMEOUT_S = 180.0


def ensure_gym_token(environ=os.environ) -> None:
    """Before the trainer joins the cluster: ``CUA_GYM_TOKEN`` set in ``environ`` (the user's, from the variable or
    the file ``CUA_GYM_TOKEN_FILE`` names: the one token of the run's fleet), else a fresh random one."""
    from cua_rl.http.auth import GYM_TOKEN, new_token, token_from_env

    environ[GYM_TOKEN] = token_from_env(GYM_TOKEN, environ) or new_token()


def desktops_for(free_cpus: float, cpus_per_desktop: float, min_per_node: int, max_per_node: int) -> int:
    """Executions a node's gym may run on ``free_cpus`` Ray CPUs; 0 = no gym there."""
    n = min(max_per_node, math.floor(free_cpus / cpus_per_desktop + 1e-9))
    return n if n >= min_per_node else 0


def gym_argv(host: str, port: int, max_executions: int, gym_id: str, embedded) -> list[str]:
    """``cua-gym serve`` for one node: the run's gym id and the embedded gym's settings."""
    argv = [sys.executable, "-m", "cua_rl.local_gym", "serve", "--host", host, "--port", str(port), "--gym-id",
            gym_id, "--max-executions", str(max_executions), "--pool-size", str(min(embedded.num_desktops,
                                                                                     max_executions))]
    if embedded.tasks_dir:
        argv += ["--tasks-dir", os.path.abspath(os.path.expanduser(embedded.tasks_dir))]
    if embedded.reuse_browsers is not None:
        argv += ["--reuse-browsers", str(embedded.reuse_browsers)]
    if embedded.restart_in_page:
        argv.append("--restart-in-page")
    return argv


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG: the gym ends its desktops and exits


class GymNode:
    """The Ray actor: one ``cua-gym serve`` on this node (made a Ray actor class by ``RayGyms.start``)."""

    def __init__(self, argv_tail: list, log_dir: str, port: int = 0) -> None:
        import ray

        from cua_rl.http.serve import free_port

        self.host = ray.util.get_node_ip_address()
        self.port = port or free_port(self.host)
        argv = gym_argv(self.host, self.port, *argv_tail)
        os.makedirs(log_dir, exist_ok=True)
        self.log = os.path.join(log_dir, f"ray-gym-{self.host}-{self.port}.log")
        from cua_rl.http.auth import GYM_TOKEN, token_from_env

        token = token_from_env(GYM_TOKEN)
        if not token:
            raise RuntimeError(f"no {GYM_TOKEN} in the Ray gym's environment: a gym on {self.host} would serve "
                               f"anyone on the network (ray_gyms.ensure_gym_token sets it before the trainer joins "
                               f"the cluster)")
        with open(self.log, "w") as sink:
            self.proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                         env={**os.environ, GYM_TOKEN: token})

    def url(self) -> str:
        """The gym's URL once its ``/health`` answers (RuntimeError naming its log if it does not)."""
        import httpx

        url = f"http://{self.host}:{self.port}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gym on {self.host} exited ({self.proc.returncode}): {_tail(self.log)}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the gym on {self.host} did not answer within {READY_TIMEOUT_S:.0f} s: {_tail(self.log)}")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(f.read().splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class RayGyms:
    """The gyms started on the cluster for one run: their URLs, ended by ``stop``."""

    urls: list[str] = field(default_factory=list)
    actors: list = field(default_factory=list)

    @classmethod
    def start(cls, opts: RayGymsConfig, embedded: EmbeddedStackConfig, gym_id: str, log_dir: str) -> "RayGyms":
        """One gym per node with spare CPUs (module docstring); none when no node has room (said once). ``opts``:
        the run's ``gym_fleet.ray_gyms``; ``embedded``: the gym's settings (tasks, desktops, browsers); ``gym_id``:
        what it serves (the run's, else the embedded gym's)."""
        import ray
        from ray._private import state
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        gym_id = gym_id or embedded.gym_id
        free = state.state.available_resources_per_node()
        nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
        actor_class = ray.remote(GymNode)
        gyms = cls()
        try:
            plan = []
            for node_id, address in sorted(nodes.items(), key=lambda kv: kv[1]):
                cpus = float(free.get(node_id, {}).get("CPU", 0.0))
                n = desktops_for(cpus, opts.cpus_per_desktop, opts.min_per_node, opts.max_per_node)
                logger.info("Ray node %s: %.2f CPUs free -> %s", address, cpus,
                            f"a gym of {n} executions" if n else "no gym")
                if n:
                    actor = actor_class.options(
                        num_cpus=n * opts.cpus_per_desktop, name=None,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
                    ).remote([n, gym_id, embedded], log_dir, opts.port)
                    gyms.actors.append(actor)
                    plan.append((address, n))
            gyms.urls = ray.get([a.url.remote() for a in gyms.actors], timeout=READY_TIMEOUT_S + 30)
        except BaseException:
            gyms.stop()
            raise
        if not gyms.urls:
            logger.warning("gym_fleet.ray_gyms: no Ray node has %.2f CPUs free for a gym (cpus_per_desktop %.2f x "
                           "min_per_node %d) once the run's workers are placed", opts.cpus_per_desktop *
                           opts.min_per_node, opts.cpus_per_desktop, opts.min_per_node)
        else:
            logger.info("gyms on the Ray cluster: %s", ", ".join(f"{u} ({n} executions)"
                                                                  for u, (_, n) in zip(gyms.urls, plan)))
        return gyms

    def stop(self) -> None:
        """End every gym (its desktops with it) and its actor."""
        if not self.actors:
            return
        import ray

        try:
            ray.get([a.stop.remote() for a in self.actors], timeout=90)
        except Exception as exc:  # noqa: BLE001 - the actors are killed below either way
            logger.warning("ending the Ray gyms: %s", exc)
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone with its node
                pass
        self.actors = []
