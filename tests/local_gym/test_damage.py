"""X DAMAGE, which the gym's settle wait after an action listens to instead of polling the screen: a real
Xvfb, painted on from a second X connection as an application would. A still screen reports nothing, each
change reports once (re-armed), and the watch can be closed from a worker thread as desktops are stopped.
The gym-level behaviour (``screen_changed`` true for typing, false for a key that draws nothing) is in
test_api.py."""

import asyncio

import pytest
from cua_rl.local_gym.screen import DamageWatch
from tests.local_gym.conftest import paint as _paint

pytestmark = pytest.mark.desktop


async def test_still_screen_reports_nothing_and_each_change_reports_once(x_display):
    watch = DamageWatch(x_display)
    try:
        watch.arm()
        assert not await watch.changed_within(0.2)
        _paint(x_display, 0xFF0000)
        assert await watch.changed_within(2.0)
        assert not await watch.changed_within(0.1)  # that change was consumed; nothing new since
        _paint(x_display, 0x00FF00)
        assert await watch.changed_within(2.0)
        _paint(x_display, 0x0000FF)
        watch.arm()  # arming forgets changes made before it
        assert not await watch.changed_within(0.1)
        assert watch.notifications >= 2
    finally:
        await asyncio.to_thread(watch.close)  # from a worker thread, as Desktop.stop runs
    assert watch._loop is None  # the reader was removed on the loop


def test_a_display_without_a_server_gives_no_watch():
    assert DamageWatch.open(":4999") is None  # the settle wait then compares grabs
