"""The ``gym_fleet`` section of the run's config: several gym hosts in one run (``gym_base_url`` a list;
cua_rl/genv/fleet.py places groups by capacity and drains hosts that fail), how often each host's health is asked,
and our gyms started on a Ray cluster's nodes (``gym_fleet.ray_gyms``, cua_rl/areal_ext/ray_gyms.py). It lives
beside the fleet it configures; ``cua_rl.config.CUAConfig`` holds it as its ``gym_fleet`` field."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RayGymsConfig:
    """Our gym server on the Ray cluster's nodes for this run (``scheduler.type=ray``; cua_rl/areal_ext/ray_gyms.py):
    once AReaL's workers are placed, one Ray actor on each node with spare CPUs runs ``cua-gym serve`` on the
    node's address, taking ``cpus_per_desktop`` Ray CPUs per execution it may run; the gyms join the run's fleet
    and end with the run. They serve ``gym_id`` (default desktop) with the embedded gym's settings (``embedded.*``:
    tasks_dir, num_desktops, reuse_browsers)."""

    enabled: bool = field(default=False, metadata={
        "help": "Start our gym on the Ray cluster's nodes for this run (needs scheduler.type=ray)."})
    cpus_per_desktop: float = field(default=0.25, metadata={
        "help": "Ray CPUs a node's gym takes per execution it may run."})
    min_per_node: int = field(default=1, metadata={"help": "A node with room for fewer executions gets no gym."})
    max_per_node: int = field(default=16, metadata={"help": "Executions one node's gym runs at most."})
    port: int = field(default=0, metadata={"help": "Port of each node's gym; 0 picks a free one on each node."})

    def __post_init__(self):
        if not self.cpus_per_desktop > 0:
            raise ValueError(f"gym_fleet.ray_gyms.cpus_per_desktop must be > 0, got {self.cpus_per_desktop}")
        if not 1 <= self.min_per_node <= self.max_per_node:
            raise ValueError(f"gym_fleet.ray_gyms: need 1 <= min_per_node <= max_per_node, got {self.min_per_node}, "
                             f"{self.max_per_node}")
        if not 0 <= self.port <= 65535:
            raise ValueError("gym_fleet.ray_gyms.port must be 0..65535")


@dataclass
class GymFleetConfig:
    """Several gym hosts in one run (``gym_base_url`` a list; cua_rl/genv/fleet.py): how often each host's health
    is asked and how long an answer may take (two failed checks in a row drain a host), and our gyms started on
    the Ray cluster's nodes."""

    health_interval_seconds: float = field(default=2.0, metadata={
        "help": "Seconds between two health checks of each gym host (two failed in a row drain it)."})
    health_timeout_seconds: float = field(default=3.0, metadata={
        "help": "Seconds a gym host's health answer may take before the check counts as failed."})
    ray_gyms: RayGymsConfig = field(default_factory=RayGymsConfig, metadata={
        "help": "Our gym started on the Ray cluster's nodes, joining the run's fleet."})

    def __post_init__(self):
        if not (self.health_interval_seconds > 0 and self.health_timeout_seconds > 0):
            raise ValueError("gym_fleet.health_interval_seconds and health_timeout_seconds must be > 0")
