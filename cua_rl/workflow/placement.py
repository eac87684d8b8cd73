"""Where a group of episodes plays when the run has several gym hosts, and what happens when that host dies.

Why a module of its own: the rules of a fleet (cua_rl/genv/fleet.py) meet the group's here, once, for the
training workflow and for ``cua-eval`` alike:

- the group's episodes all play on the host its placement chose (a task row's own gym URL only says which
  fleet it belongs to: ``fleet_for``); an execution never leaves its host;
- a group whose host drains while an episode of it is unfinished is dropped: its episodes are cancelled (each
  still asks the host to terminate its execution, in the background), never trained, and counted as drained, not lost (the lost-episode health
  check reads lost episodes only); its task item is played again, same seeds, on another host, so nothing is
  recorded as dropped for resume. A group whose episodes were all evaluated is kept, whatever the host does
  next. An episode dropped as the gym's (or crashed) makes the fleet ask that host again (``Fleet.suspect``):
  when it fails, the host drains and the group is played again, else the loss stands;
- after ``MAX_RERUNS`` drains in a row the group's episodes are lost as the gym's (no host kept it alive).

With one gym there is no fleet: ``play_group`` plays on it as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from cua_rl.genv.fleet import MAX_RERUNS, Fleet, Placement, fleet_of, gym_urls
from cua_rl.runs import DropCause
from cua_rl.trajectory import EpisodeOutcome

from .episode import Dropped

logger = logging.getLogger(__name__)
_ENDING: set[asyncio.Future] = set()   # cancelled episodes of drained groups, still ending their executions

# play(gym_url, index, placement) -> the episode's outcome; the placement (None without a fleet) makes its
# execution (``Placement.execution``: the fleet hears of each 429, of the create's success or failure)
Play = Callable[[str, int, "Placement | None"], Awaitable[EpisodeOutcome | Dropped]]


@dataclass
class Drained:
    """One placement of a group lost to its host's drain: which host, and how many episodes were dropped."""

    url: str
    episodes: int


def fleet_for(row_gym: str, run_gym: str, gym_id: str, **options) -> Fleet | None:
    """The fleet a task row plays on: the run's (``run_gym``, every host of it, those started on Ray included)
    when the row's own gym URLs are among the run's, else the row's own list; None for a single gym."""
    own, run = gym_urls(row_gym or run_gym), gym_urls(run_gym)
    return fleet_of(run if set(own) <= set(run) else own, gym_id, **options)


async def play_group(fleet: Fleet | None, single_url: str, n: int, play: Play,
                     on_drained: Callable[[Drained], None] = lambda d: None) -> tuple[list, str]:
    """(each episode's outcome, a Dropped or an exception, in order; the host they played on) for a group of
    ``n`` episodes: on ``single_url`` without a fleet, else placed (module docstring). ``on_drained`` hears of
    each placement lost to a drain."""
    if fleet is None:
        results = await asyncio.gather(*(play(single_url, i, None) for i in range(n)), return_exceptions=True)
        return list(results), single_url
    for attempt in range(MAX_RERUNS + 1):
        placement = await fleet.place(n)
        try:
            results = await _play_placed(fleet, placement, n, play)
        finally:
            placement.release()
        if results is not None:
            return results, placement.url
        on_drained(Drained(placement.url, n))
        if attempt < MAX_RERUNS:
            logger.warning("group of %d episodes on drained gym host %s dropped (never trained); playing its task "
                           "item again on another host (%d/%d)", n, placement.url, attempt + 1, MAX_RERUNS)
    why = f"its gym host drained {MAX_RERUNS + 1} times in a row"
    logger.error("group of %d episodes lost: %s", n, why)
    return [Dropped(DropCause.GYM, why)] * n, placement.url


async def _play_placed(fleet: Fleet, placement, n: int, play: Play) -> list | None:
    """The group's results, or None when its host drained before every episode was evaluated."""
    episodes = [asyncio.ensure_future(play(placement.url, i, placement)) for i in range(n)]
    together = asyncio.gather(*episodes, return_exceptions=True)
    lost = asyncio.ensure_future(placement.lost.wait())
    try:
        await asyncio.wait({together, lost}, return_when=asyncio.FIRST_COMPLETED)
        if together.done():
            results = together.result()
            gym_failed = any(isinstance(r, Exception) or (isinstance(r, Dropped) and r.cause == DropCause.GYM)
                             for r in results)
            if not gym_failed or not await fleet.suspect(placement.host):
                return list(results)   # evaluated (or lost for another cause): kept, whatever the host does next
            return None
        for task in episodes:
            task.cancel(f"gym host {placement.url} drained")
        # each cancelled episode still asks its dead host to end its execution (retried for ~30 s when the host
        # is blackholed): that finishes on its own while the task item is played again elsewhere
        _ENDING.add(together)
        together.add_done_callback(_ENDING.discard)
        return None
    finally:
        lost.cancel()
        if not together.done() and together not in _ENDING:   # cancelled from outside (AReaL stopping)
            together.cancel()
            with contextlib.suppress(BaseException):
                await together
