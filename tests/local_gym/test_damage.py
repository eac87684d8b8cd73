"""X DAMAGE, which the gym's settle wait after an action listens to instead of polling the screen: a real
Xvfb, painted on from a second X connection as an application would. A still screen reports nothing, each
change reports once (re-armed), and the watch can be closed from a worker thread as desktops are stopped.
A settled frame is reused as the screen (for the screenshot after an action and the next action's 'before')
only while DAMAGE reports no change since it was grabbed.
The gym-level behaviour (``screen_changed`` true for typing, false for a key that draws nothing) is in
test_api.py."""

import asyncio

import pytest

from cua_rl.local_gym.screen import DamageWatch, Screen, settle
from gym_helpers import paint as _paint

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


async def test_a_settled_frame_is_the_screen_until_a_change(x_display):
    screen = Screen(x_display)
    try:
        before = screen.arm_and_grab()
        _paint(x_display, 0x336699, 20, 20, 40, 30)           # the "action"
        changed, frame = await settle(screen, before, 1.0)
        assert changed
        screen.remember(frame)
        assert screen.frame_now() is frame                    # nothing changed since: no grab
        assert screen.arm_and_grab() is frame                 # and it is the next action's 'before'
        screen.remember(frame)
        _paint(x_display, 0xCC3300, 200, 100, 10, 10)         # another application draws after the settle
        now = screen.frame_now()
        assert now is not frame and now != frame and now == screen.grab()
        assert screen.arm_and_grab() is not frame             # the change was there before this arm
        screen.remember(frame)
        screen.damage.arm()                                   # damage forgotten elsewhere: the frame is no proof
        assert screen.frame_now() is not frame
    finally:
        screen.close()


def test_a_display_without_a_server_gives_no_watch():
    assert DamageWatch.open(":4999") is None  # the settle wait then compares grabs
