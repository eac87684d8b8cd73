"""Forks of MiniWoB++ pages by replay (fork.py, docs/local_gym.md "Forks"): after three clicks on a seeded page,
two children show the parent's screen byte for byte and have its DOM, form state and task globals; each goes its
own way (a submit on one ends only its episode); a page the package marks nondeterministic is a 409, and so is a
parent whose page state no replay can reach; nothing is left running after terminate. A Chromium per desktop:
slow tier (tests/conftest.py SLOW_TESTS)."""

from __future__ import annotations

import pytest

from cua_rl.local_gym import GymError, GymOptions, LocalGym
from cua_rl.local_gym.miniwob import _FORK_STATE_JS
from tests.hosts import descendants, wait_gone

pytestmark = pytest.mark.desktop

CLICKS = [{"type": "click", "x": 0.1, "y": y} for y in (0.33, 0.40, 0.47)]   # three of click-checkboxes' boxes
# where the page's submit button is, as fractions of the screen (the page's layout depends on its seed)
SUBMIT_AT = """(() => { const r = document.getElementById('subbtn').getBoundingClientRect();
  return {type: 'click', x: (r.left + r.width / 2) / innerWidth, y: (r.top + r.height / 2) / innerHeight}; })()"""


async def test_children_of_a_page_equal_the_parent_and_go_their_own_way_and_refusals_leave_nothing():
    opts = GymOptions(gym_id="miniwob", pool_size=2, max_spares=2, prewarm=["click-checkboxes"], fork_wait_s=2.0)
    async with LocalGym(opts) as gym:
        ex = await gym.reset("click-checkboxes", {"options": {"seed": 3}})
        eid = ex["execution_id"]
        for action in CLICKS:
            assert (await gym.act(eid, action))["ok"]
        desks = gym.manager.executions
        before, _ = await gym.screenshot(eid)
        page = await desks[eid].desktop.aevaluate(_FORK_STATE_JS)
        assert page["fields"].count("true") == 3, page["fields"]   # the three boxes are ticked

        fork = await gym.fork(eid, {"count": 2})
        kids = [c["id"] for c in fork["executions"]]
        assert fork["mask"] == [] and fork["actions"] == 3
        assert all(c["instruction"] == ex["instruction"] and c["seed"] == 3 for c in fork["executions"])
        assert [(await gym.screenshot(k))[0] for k in kids] == [before] * 2
        for k in kids:
            assert await desks[k].desktop.aevaluate(_FORK_STATE_JS) == page, "a child's page is not the parent's"
        assert (await gym.screenshot(eid))[0] == before

        # each its own way: a submit ends child 0's episode only
        assert (await gym.act(kids[0], await desks[kids[0]].desktop.aevaluate(SUBMIT_AT)))["ok"]
        done = {x: (await gym.evaluate(x))["result"]["miniwob"]["done"] for x in (eid, *kids)}
        assert done == {eid: False, kids[0]: True, kids[1]: False}
        assert (await gym.screenshot(eid))[0] == before and (await gym.screenshot(kids[1]))[0] == before

        # a parent whose page changed behind the replay's back (a page with state of its own): 409, no child
        await desks[eid].desktop.aevaluate("document.body.setAttribute('data-moved', '1')")
        with pytest.raises(GymError) as err:
            await gym.fork(eid, {"count": 1})
        assert err.value.status == 409 and "task state is not: dom: differs" in err.value.detail, err.value.detail
        assert set(desks) == {eid, *kids}

        # a page the package marks nondeterministic is refused before any child is made
        other = (await gym.reset("choose-date", {"options": {"seed": 1}}))["execution_id"]
        with pytest.raises(GymError) as err:
            await gym.fork(other, {"count": 1})
        assert err.value.status == 409 and "marks this page nondeterministic" in err.value.detail
        assert set(desks) == {eid, other, *kids}

        pids = descendants([p for x in (eid, other, *kids) for p in desks[x].desktop.pids()])
        for x in (eid, other, *kids):
            await gym.terminate(x)
    assert pids and wait_gone(pids) == set(), "terminate left a browser behind"
