"""Scripted solutions of MiniWoB++ tasks that read the page's DOM: the tests' proof that a task can reach reward 1
through the gym's HTTP API (real clicks and typing on the X display of a real Chromium), the SFT demonstrator of
the MiniWoB++ warm start (cua_rl/sft/miniwob_demos.py) and the chance baseline's random clicker
(bench/miniwob_chance.py).

A solver may read the page (the DOM, through the gym's own DevTools connection, in-process); the agent
never can. It then acts only through ``POST .../actions`` with the same action schema an agent uses.
Each solver gets a ``Play`` and the instance's utterance (the create reply's ``instruction``). A subclass of
``Play`` may record each action before it is played (``act``): the demonstrator does.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Awaitable, Callable

from cua_rl.genv import GenvClient

_CENTER_JS = """(() => { const el = (%s); if (!el) return null;
  el.scrollIntoView({block: 'nearest'}); const r = el.getBoundingClientRect();
  return [(r.left + r.width / 2) / screen.width, (r.top + r.height / 2) / screen.height]; })()"""
# screen.width/height: the X screen in CSS pixels. The browser window may be wider than the screen (Chromium's
# minimum window width), so the page's own innerWidth is not the screen's.


def by_text(selector: str, text: str) -> str:
    """JS: the first element matching ``selector`` whose trimmed text is ``text``."""
    return (f"[...document.querySelectorAll({json.dumps(selector)})]"
            f".find(e => e.textContent.trim() === {json.dumps(text)})")


def quoted(utterance: str) -> list[str]:
    return re.findall(r'"([^"]*)"', utterance)


class Play:
    """Acts on one execution through the HTTP API; reads its page in-process."""

    def __init__(self, client: GenvClient, execution_id: str, desktop, utterance: str) -> None:
        self.client, self.eid, self.desktop, self.utterance = client, execution_id, desktop, utterance

    async def js(self, expression: str):
        return await self.desktop.aevaluate(expression)

    async def act(self, action: dict) -> None:
        reply = await self.client.act(self.eid, action)
        if not reply.get("ok"):
            raise RuntimeError(f"the gym refused action {action}: {reply}")

    async def center(self, element_js: str) -> tuple[float, float]:
        """The element's centre as a fraction of the screen (clamped), scrolled into view first."""
        where = await self.js(_CENTER_JS % element_js)
        if where is None:
            raise LookupError(f"no element {element_js}")
        x, y = (min(max(v, 0.0), 1.0) for v in where)
        return x, y

    async def click(self, element_js: str) -> None:
        x, y = await self.center(element_js)
        await self.act({"type": "click", "x": x, "y": y})

    async def type(self, text: str) -> None:
        await self.act({"type": "type", "text": text})

    async def key(self, *keys: str) -> None:
        await self.act({"type": "key", "keys": list(keys)})


Solver = Callable[[Play], Awaitable[None]]
SOLVERS: dict[str, Solver] = {}


def solves(*names: str):
    def register(fn: Solver) -> Solver:
        for name in names:
            SOLVERS[name] = fn
        return fn
    return register


@solves("click-test")
async def _click_test(p: Play) -> None:
    await p.click("document.getElementById('subbtn')")


@solves("click-test-2", "click-test-transfer")
async def _click_one_or_two(p: Play) -> None:
    label = re.search(r"Click button (\w+)\.", p.utterance).group(1)
    await p.click(by_text("#area button", label))


@solves("click-button", "unicode-test")
async def _click_button(p: Play) -> None:
    await p.click(by_text("#area button", quoted(p.utterance)[0]))


@solves("click-link")
async def _click_link(p: Play) -> None:
    await p.click(by_text("#area span.alink, #area a", quoted(p.utterance)[0]))


@solves("click-button-sequence")
async def _button_sequence(p: Play) -> None:
    await p.click("document.getElementById('subbtn')")
    await p.click("document.getElementById('subbtn2')")


@solves("click-dialog")
async def _close_dialog(p: Play) -> None:
    await p.click("document.querySelector('.ui-dialog-titlebar button')")


@solves("click-dialog-2")
async def _dialog_button(p: Play) -> None:
    label = quoted(p.utterance)[0]
    if label.lower() == "x":
        await p.click("document.querySelector('.ui-dialog-titlebar button')")
    else:
        await p.click(by_text(".ui-dialog-buttonset button", label))


@solves("click-widget")
async def _click_widget(p: Play) -> None:
    kind = quoted(p.utterance)[0]
    await p.click(f"document.querySelector('#area [data-type=\"{kind}\"]')")


@solves("click-color")
async def _click_color(p: Play) -> None:
    color = re.search(r"Click on the (.+) colored box\.", p.utterance).group(1).strip()
    await p.click(f"document.querySelector('#area .color[data-color=\"{color}\"]')")


@solves("click-option")
async def _click_option(p: Play) -> None:
    name = re.search(r"Select (.*) and click Submit\.", p.utterance).group(1)
    await p.click(f"{by_text('#boxes label', name)}.querySelector('input')")
    await p.click("document.getElementById('subbtn')")


@solves("click-checkboxes")
async def _click_checkboxes(p: Play) -> None:
    names = re.search(r"Select (.*) and click Submit\.", p.utterance).group(1)
    for name in ([] if names == "nothing" else [n.strip() for n in names.split(",")]):
        await p.click(f"{by_text('#boxes label', name)}.querySelector('input')")
    await p.click("document.getElementById('subbtn')")


@solves("click-tab")
async def _click_tab(p: Play) -> None:
    n = re.search(r"Tab #(\d)", p.utterance).group(1)
    await p.click(f"document.querySelector('#area ul a[href=\"#tabs-{n}\"]')")


@solves("click-collapsible", "click-collapsible-nodelay")
async def _click_collapsible(p: Play) -> None:
    await p.click("document.querySelector('#area h3')")
    for _ in range(100):   # the section slides open (the -nodelay variant at once)
        if await p.js("document.querySelectorAll('.ui-accordion-content:not(.ui-accordion-content-active)')"
                      ".length === 0 && !$('.ui-accordion-content').is(':animated')"):
            break
        await asyncio.sleep(0.02)
    await p.click("document.getElementById('subbtn')")


@solves("focus-text")
async def _focus_text(p: Play) -> None:
    await p.click("document.getElementById('tt')")


@solves("focus-text-2")
async def _focus_nth(p: Play) -> None:
    nth = {"1st": 1, "2nd": 2, "3rd": 3}[re.search(r"the (\w+) input", p.utterance).group(1)]
    await p.click(f"document.getElementById('tt{nth}')")


@solves("enter-text", "enter-text-dynamic")
async def _enter_text(p: Play) -> None:
    await p.click("document.getElementById('tt')")
    await p.type(quoted(p.utterance)[0])
    await p.click("document.getElementById('subbtn')")


@solves("enter-text-2")
async def _enter_text_case(p: Play) -> None:
    text = quoted(p.utterance)[0]
    await p.click("document.getElementById('tt')")
    await p.type(text.upper() if "upper case" in p.utterance else text.lower())
    await p.click("document.getElementById('subbtn')")


@solves("enter-password")
async def _enter_password(p: Play) -> None:
    password = quoted(p.utterance)[0]
    for field in ("password", "verify"):
        await p.click(f"document.getElementById('{field}')")
        await p.type(password)
    await p.click("document.getElementById('subbtn')")


@solves("login-user")
async def _login(p: Play) -> None:
    user, password = quoted(p.utterance)[:2]
    await p.click("document.getElementById('username')")
    await p.type(user)
    await p.click("document.getElementById('password')")
    await p.type(password)
    await p.click("document.getElementById('subbtn')")


@solves("simple-arithmetic")
async def _arithmetic(p: Play) -> None:
    a, op, b = (await p.js("document.getElementById('math-problem').textContent")).split()[:3]
    value = {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
    await p.click("document.getElementById('math-answer')")
    await p.type(str(value))
    await p.click("document.getElementById('subbtn')")


@solves("simple-algebra")
async def _algebra(p: Play) -> None:
    problem = (await p.js("document.getElementById('math-problem').textContent")).strip()
    left, right = (s.split() for s in problem.split("="))
    total = int(right[0])
    if left[0] == "x":          # x + d = m, x - d = m
        value = total - int(left[2]) if left[1] == "+" else total + int(left[2])
    else:                       # d + x = m, d - x = m
        value = total - int(left[0]) if left[1] == "+" else int(left[0]) - total
    await p.click("document.getElementById('math-answer')")
    await p.type(str(value))
    await p.click("document.getElementById('subbtn')")


@solves("grid-coordinate")
async def _grid(p: Play) -> None:
    coords = re.search(r"(\(-?\d,-?\d\))", p.utterance).group(1)
    await p.click(f"document.getElementById({json.dumps(coords)})")
