"""The gym's ``GET /metrics``: Prometheus' text format, through ``prometheus_client`` (one registry per gym).

Why: a fleet of gym hosts is watched like any other service fleet, by a Prometheus that scrapes each host.
What a host shows: its executions by state (``creating``, ``running``, ``evaluating``, ``terminating``; every
state present from start-up, at 0), its capacity (``max_executions`` and what is free of it), creates refused
because it was full (429) or failed (503), executions created and ended, steps of stopping a desktop that failed
(each logged; the other steps of that stop ran all the same), and latency histograms of create
(an execution's start, its task's set-up included), step (one action and the wait for its screen to settle)
and evaluate; and the client library's ``process_*`` (CPU seconds, memory, open files of the gym's process) and
``python_info``. docs/protocols.md §1.10 lists the names.

A registry per ``GymMetrics``, not the library's global one: several gyms can live in one process (the tests
start them so), and each counts only its own. The ``*_created`` timestamps the library adds to counters and
histograms are left out of the text: the series are the ones documented, and a restart shows in
``process_start_time_seconds``.
"""

from __future__ import annotations

import threading

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

PREFIX = "cua_gym"
STATES = ("creating", "running", "evaluating", "terminating")
# seconds: a warm create takes ~0.05 s, a cold one 0.4-3 s, a VM's tens; a step 0.05-1 s; an evaluate 0.01-60 s
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST
COUNTERS = {"created": "Executions created", "terminated": "Executions ended (terminated or reaped)",
            "refused_full": "Creates refused with 429 because the gym was full",
            "create_failed": "Creates that failed (503: no desktop started, or the task's set-up failed)",
            "stop_errors": "Steps of stopping a desktop that failed (logged; the other steps ran all the same)"}


class _WithoutCreated:
    """The registry's families less their ``<name>_created`` samples (what ``generate_latest`` is given)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self):
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if s.name != f"{family.name}_created"]
            yield family


class GymMetrics:
    """What one gym counts and times; ``render`` writes it with the manager's state now."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._executions = Gauge(f"{PREFIX}_executions", "Executions of this gym by state", ["state"], registry=r)
        for state in STATES:
            self._executions.labels(state)
        self._free = Gauge(f"{PREFIX}_capacity_free", "Executions this gym can still create now (GET .../capacity)",
                           registry=r)
        self._max = Gauge(f"{PREFIX}_capacity_max", "Executions this gym runs at most at once (max_executions)",
                          registry=r)
        self.counters = {name: Counter(f"{PREFIX}_{name}", text, registry=r) for name, text in COUNTERS.items()}
        self.create = Histogram(f"{PREFIX}_create_seconds",
                                "Seconds to create an execution (its desktop and task set-up)", buckets=BUCKETS,
                                registry=r)
        self.step = Histogram(f"{PREFIX}_step_seconds", "Seconds to play one action and let the screen settle",
                              buckets=BUCKETS, registry=r)
        self.evaluate = Histogram(f"{PREFIX}_evaluate_seconds", "Seconds to evaluate an execution", buckets=BUCKETS,
                                  registry=r)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self._render_lock = threading.Lock()   # the gauges set and written together, one scrape at a time

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name].inc(n)

    def render(self, states: dict[str, int], free: int, most: int) -> str:
        with self._render_lock:
            for state in STATES:
                self._executions.labels(state).set(int(states.get(state, 0)))
            self._free.set(free)
            self._max.set(most)
            return generate_latest(_WithoutCreated(self.registry)).decode()
