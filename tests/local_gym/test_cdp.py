"""The gym's DevTools pipe (cua_rl/local_gym/cdp.py) over real pipes, the browser's end played by the test."""

import asyncio
import json
import os

import pytest

from cua_rl.local_gym.cdp import CDPPipe


def _answer(fd: int, msg_id: int, result: dict) -> None:
    os.write(fd, json.dumps({"id": msg_id, "result": result}).encode() + b"\0")


def test_an_answer_to_a_call_its_caller_gave_up_on_leaves_the_reader_reading():
    """A call whose ``acall`` timed out is cancelled; its late answer once raised InvalidStateError in the reader
    thread, which died ("Exception in thread cdp-chromium"), so every later call failed and the gym built a
    new browser (seen in issue 85's runs)."""
    to_browser, gym_end = os.pipe()           # the browser reads to_browser; the gym writes gym_end
    browser_end, from_browser = os.pipe()     # the gym reads browser_end; the browser writes from_browser
    cdp = CDPPipe(gym_end, browser_end, name="test")
    try:
        with pytest.raises(TimeoutError):
            asyncio.run(cdp.acall("Page.slow", timeout_s=0.05))
        _answer(from_browser, 1, {"late": True})     # the answer to the call given up on
        later = cdp.send("Page.next")
        _answer(from_browser, 2, {"ok": True})
        assert later.result(timeout=5) == {"ok": True}
    finally:
        # only the browser's ends are the test's: the pipe closes its sending end, and its reader the receiving
        # end once the browser's end is gone (closing that here too closed a reused fd of a later test)
        cdp.close()
        os.close(from_browser)
        cdp._reader.join(5)
        os.close(to_browser)
