"""Exact binomial statistics, in one place: the Clopper-Pearson interval of a rate from a count.

Why here: the gate calibration (bench/gate_calibration.py), ``cua-eval --suite miniwob`` (cua_rl/evaluate.py) and
the MiniWoB++ chance baseline (bench/miniwob_chance.py) all report "k of n" with its exact interval; one function
keeps them equal. Pure Python (no scipy): the binomial CDF is summed and its inverse found by bisection, which is
exact to the 4 decimals reported for any n this project plays (thousands of episodes at most).
"""

from __future__ import annotations

import math


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))


def _solve(f, target: float) -> float:
    """The p in [0, 1] where the decreasing function ``f`` equals ``target`` (bisection)."""
    low, high = 0.0, 1.0
    for _ in range(100):
        mid = (low + high) / 2
        if f(mid) > target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def clopper_pearson(passed: int, runs: int, alpha: float = 0.05) -> tuple[float, float]:
    """The two-sided (1 - alpha) Clopper-Pearson interval of a rate from ``passed`` of ``runs``, rounded to 4
    decimals; (0.0, 1.0) for no runs."""
    if not 0 <= passed <= runs:
        raise ValueError(f"clopper_pearson: {passed} of {runs} is no count")
    if runs == 0:
        return 0.0, 1.0
    upper = 1.0 if passed == runs else _solve(lambda p: binomial_cdf(passed, runs, p), alpha / 2)
    # the lower bound of the pass rate is one minus the upper bound of the failure rate
    lower = 0.0 if passed == 0 else 1 - _solve(lambda q: binomial_cdf(runs - passed, runs, q), alpha / 2)
    return round(lower, 4), round(upper, 4)


def rate_with_interval(successes: int, n: int) -> dict:
    """``{"successes", "n", "rate", "cp95": [low, high]}``: how every rate of ``cua-eval --suite`` is written."""
    return {"successes": successes, "n": n, "rate": round(successes / n, 4) if n else None,
            "cp95": list(clopper_pearson(successes, n))}
