"""The gym's ``GET /metrics``: Prometheus' text format (version 0.0.4), written here without a client library.

Why: a fleet of gym hosts is watched like any other service fleet, by a Prometheus that scrapes each host.
What a host shows: its executions by state (``creating``, ``running``, ``evaluating``, ``terminating``; every
state present from start-up, at 0), its capacity (``max_executions`` and what is free of it), creates refused
because it was full (429) or failed (503), executions created and ended, steps of stopping a desktop that failed
(each logged; the other steps of that stop ran all the same), and latency histograms of create
(an execution's start, its task's set-up included), step (one action and the wait for its screen to settle)
and evaluate. docs/protocols.md §1.10 lists the names.
"""

from __future__ import annotations

import bisect
import threading
import time
from contextlib import contextmanager

PREFIX = "cua_gym"
STATES = ("creating", "running", "evaluating", "terminating")
# seconds: a warm create takes ~0.05 s, a cold one 0.4-3 s, a VM's tens; a step 0.05-1 s; an evaluate 0.01-60 s
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Histogram:
    """Cumulative buckets, sum and count of observed seconds (Prometheus' histogram)."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.name, self.help, self.buckets = name, help_text, tuple(buckets)
        self._counts = [0] * (len(self.buckets) + 1)   # the last one: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, seconds)] += 1
            self._sum += seconds

    @contextmanager
    def time(self):
        started = time.monotonic()
        try:
            yield
        finally:
            self.observe(time.monotonic() - started)

    def lines(self) -> list[str]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        name = f"{PREFIX}_{self.name}"
        out = [f"# HELP {name} {self.help}", f"# TYPE {name} histogram"]
        running = 0
        for bound, count in zip((*self.buckets, float("inf")), counts):
            running += count
            out.append(f'{name}_bucket{{le="{_number(bound)}"}} {running}')
        out += [f"{name}_sum {_number(total)}", f"{name}_count {running}"]
        return out


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else f"{value:.1f}"


class GymMetrics:
    """What one gym counts and times; ``render`` writes it with the manager's state now."""

    def __init__(self) -> None:
        self.create = Histogram("create_seconds", "Seconds to create an execution (its desktop and task set-up)")
        self.step = Histogram("step_seconds", "Seconds to play one action and let the screen settle")
        self.evaluate = Histogram("evaluate_seconds", "Seconds to evaluate an execution")
        self.counters = {"created": 0, "terminated": 0, "refused_full": 0, "create_failed": 0, "stop_errors": 0}
        self._lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def render(self, states: dict[str, int], free: int, most: int) -> str:
        g = PREFIX
        out = [f"# HELP {g}_executions Executions of this gym by state",
               f"# TYPE {g}_executions gauge"]
        out += [f'{g}_executions{{state="{s}"}} {int(states.get(s, 0))}' for s in STATES]
        out += [f"# HELP {g}_capacity_free Executions this gym can still create now (GET .../capacity)",
                f"# TYPE {g}_capacity_free gauge", f"{g}_capacity_free {free}",
                f"# HELP {g}_capacity_max Executions this gym runs at most at once (max_executions)",
                f"# TYPE {g}_capacity_max gauge", f"{g}_capacity_max {most}"]
        helps = {"created": "Executions created", "terminated": "Executions ended (terminated or reaped)",
                 "refused_full": "Creates refused with 429 because the gym was full",
                 "create_failed": "Creates that failed (503: no desktop started, or the task's set-up failed)",
                 "stop_errors": "Steps of stopping a desktop that failed (logged; the other steps ran all the same)"}
        with self._lock:
            counters = dict(self.counters)
        for name, value in counters.items():
            out += [f"# HELP {g}_{name}_total {helps[name]}", f"# TYPE {g}_{name}_total counter",
                    f"{g}_{name}_total {value}"]
        for histogram in (self.create, self.step, self.evaluate):
            out += histogram.lines()
        return "\n".join(out) + "\n"
