"""In-process keyboard and mouse input for one X display through the XTEST extension.

Why not xdotool: a subprocess per action costs ~3 ms of spawn and hides 12-100 ms default delays;
XTEST from python-xlib is ~0.3 ms and has no hidden waits.
Characters with no key in the current keymap (e.g. non-Latin text) are typed through a spare keycode
that is remapped on the fly, as xdotool does.

Whether a client has taken the input sent to it is asked with a _NET_WM_PING: the client answers once it has
processed every event before it. Its answer, a SendEvent to the root window, reaches no one when the client is an
*untrusted* X client (the desktops' apps are, xauth.py): the X server's SECURITY extension drops every event an
untrusted client sends to a trusted client's window, the root included (it checks the type after setting the
SendEvent flag, so even its ClientMessage exception never matches). So the gym reads answers as *requests*:
the X RECORD extension (trusted clients only) shows it every SendEvent request any client makes, before the
server drops it (``_PingAnswers``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import struct
import sys
import threading
import time

from Xlib import XK, X, display as xdisplay, error as xerror
from Xlib.ext import record, xtest
from Xlib.protocol import event as xevent, request

from .xgrabs import impervious_xlib

logger = logging.getLogger(__name__)

# Friendly names (what agents and reference solutions write) -> X keysym names.
KEY_ALIASES: dict[str, str] = {
    "ctrl": "Control_L", "control": "Control_L", "alt": "Alt_L", "shift": "Shift_L",
    "super": "Super_L", "win": "Super_L", "meta": "Super_L", "cmd": "Super_L",
    "enter": "Return", "return": "Return", "esc": "Escape", "escape": "Escape", "tab": "Tab",
    "backspace": "BackSpace", "delete": "Delete", "del": "Delete", "insert": "Insert",
    "space": "space", "up": "Up", "down": "Down", "left": "Left", "right": "Right",
    "home": "Home", "end": "End", "pageup": "Prior", "page_up": "Prior", "pagedown": "Next",
    "page_down": "Next", "capslock": "Caps_Lock", "caps_lock": "Caps_Lock", "menu": "Menu",
    "plus": "plus", "minus": "minus",
    **{f"f{i}": f"F{i}" for i in range(1, 13)},
}
MAX_COORD = 32767
SELECTIONS = ("PRIMARY", "SECONDARY", "CLIPBOARD")   # what copying and selecting set (clear_selections)
# How long keyboard input waits for a window to hold the input focus and answer a ping (see
# ``XInput.keyboard_ready``). A window manager under load can take hundreds of ms to focus a new window.
FOCUS_WAIT_S = 3.0
PING_WAIT_S = 1.0


class InputRefused(ValueError):
    """Input this desktop's keyboard cannot express (a character its layout has no key for): what the action
    asked, not a failure of the gym. The action answers ``ok: false`` with ``fault: "policy"`` (env.act), nothing
    sent; any other failure while playing an action is the gym's (docs/protocols.md 1.5)."""


def keysym_for_name(name: str) -> int | None:
    """Keysym of a key name ("ctrl", "Return", "a", "F5", "ä"); None when unknown."""
    if not name:
        return None
    if len(name) == 1:
        return char_keysym(name)
    alias = KEY_ALIASES.get(name.lower())
    sym = XK.string_to_keysym(alias or name)
    return sym or None


def char_keysym(ch: str) -> int:
    """Keysym of one character: Latin-1 maps to itself, the rest to the Unicode keysym range."""
    if ch == "\n":
        return XK.XK_Return
    if ch == "\t":
        return XK.XK_Tab
    code = ord(ch)
    if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF:
        return code
    return 0x01000000 + code


def _adds_shift(needs_shift: bool, keys: int, combo: bool) -> bool:
    """Whether a key that needs Shift (a shifted character) gets Shift pressed with it: always when typing; in
    a combo of ``keys`` keys only when it is the one key ("A"), as a longer combo names its own modifiers."""
    return needs_shift and (keys == 1 or not combo)


SEND_EVENT = 25          # the core SendEvent request's opcode
CLIENT_MESSAGE = 33
SEND_EVENTS = [{"core_requests": (SEND_EVENT, SEND_EVENT), "core_replies": (0, 0), "ext_requests": (0, 0, 0, 0),
                "ext_replies": (0, 0, 0, 0), "delivered_events": (0, 0), "device_events": (0, 0), "errors": (0, 0),
                "client_started": False, "client_died": False}]   # what is recorded: SendEvent requests only


class _PingAnswers:
    """The answers to the gym's _NET_WM_PINGs on one display, as the clients send them (see the module docstring),
    through RECORD: per ping, a context that records the SendEvent requests of the pinged window's client only,
    enabled on a connection of its own (impervious to server grabs) that a thread reads, and freed once the answer
    came or the wait ended. So an app that floods the server with SendEvents costs the gym nothing while it is not
    the one asked. (One context whose client is registered anew for each ping would be cheaper, but Xvfb 21.1
    records nothing for a client registered on an enabled context a second time.)"""

    def __init__(self, control) -> None:
        """``control``: the connection pings are sent on (it creates, disables and frees the contexts)."""
        if not control.has_extension("RECORD"):
            raise RuntimeError(f"display {control.get_display_name()} has no RECORD extension")
        self._control, self._root = control, control.screen().root.id
        self._ping = control.intern_atom("_NET_WM_PING")
        self._cond = threading.Condition()
        self._answered: set[int] = set()
        self._enabled = 0                 # the context whose recording has started (its StartOfData came)
        self._error: BaseException | None = None
        self._contexts: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._data = xdisplay.Display(control.get_display_name())
        try:
            impervious_xlib(self._data)
        except BaseException:
            self._data.close()
            raise
        self._thread = threading.Thread(target=self._read, name=f"x-record{control.get_display_name()}",
                                        daemon=True)
        self._thread.start()

    def _read(self) -> None:
        """The thread: enables each context handed to it and reads what it records until it is disabled."""
        try:
            while (context := self._contexts.get()) is not None:
                self._data.record_enable_context(context, lambda reply, c=context: self._recorded(c, reply))
            error: BaseException = xerror.ConnectionClosedError("the gym (its pings were stopped)")
        except BaseException as exc:  # noqa: BLE001 - kept, and raised to the next ping
            error = exc
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def _recorded(self, context: int, reply) -> None:
        """One RECORD reply: the start of ``context``'s recording, or SendEvent requests of which those that answer
        a ping (a ClientMessage of _NET_WM_PING to the root window) mark their stamps answered."""
        if reply.category in (record.StartOfData, record.EndOfData):
            with self._cond:
                self._enabled = context if reply.category == record.StartOfData else 0
                self._cond.notify_all()
        if reply.category != record.FromClient:
            return
        order = {"little": "<", "big": ">"}[sys.byteorder]
        if reply.client_swapped:
            order = "<" if order == ">" else ">"
        data, at, stamps = bytes(reply.data), 0, []
        while at + 4 <= len(data):
            opcode, length = data[at], struct.unpack(order + "H", data[at + 2:at + 4])[0] * 4
            if length == 0:   # BIG-REQUESTS: the length follows, and counts itself
                length = struct.unpack(order + "I", data[at + 4:at + 8])[0] * 4 if at + 8 <= len(data) else 0
            if length < 4:
                break
            request = data[at:at + length]
            at += length
            if opcode != SEND_EVENT or len(request) != 44:
                continue
            destination = struct.unpack(order + "I", request[4:8])[0]
            kind, message, stamp = request[12] & 0x7F, *struct.unpack(order + "2I", request[24:32])
            if destination == self._root and kind == CLIENT_MESSAGE and message == self._ping:
                stamps.append(stamp)
        if stamps:
            with self._cond:
                self._answered.update(stamps)
                self._cond.notify_all()

    def _wait_for(self, ready, timeout_s: float) -> bool:
        """Under the condition: wait until ``ready()``, False after ``timeout_s``; raises the error that ended the
        recording thread (its connection was lost)."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if self._error is not None:
                raise self._error
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._cond.wait(left)
        return True

    def watch(self, window: int, timeout_s: float) -> int | None:
        """Start recording the requests of the client of ``window``: the context, once its recording has started
        (``end`` it); None when the window is gone or the recording did not start within ``timeout_s``."""
        caught = xerror.CatchError()
        context = self._control.display.allocate_resource_id()
        record.CreateContext(display=self._control.display, onerror=caught, context=context,
                             opcode=self._control.display.get_extension_major(record.extname), element_header=0,
                             clients=[window], ranges=SEND_EVENTS)
        self._control.sync()   # created before the recording connection enables it
        if caught.get_error():
            return None
        with self._cond:
            self._answered.clear()
            self._enabled = 0    # (python-xlib hands out a freed context's id again)
            self._contexts.put(context)
            if self._wait_for(lambda: self._enabled == context, timeout_s):
                return context
        self.end(context)
        return None

    def wait(self, stamp: int, timeout_s: float) -> bool:
        """True once the answer with ``stamp`` was sent, False after ``timeout_s``. The X server sends what RECORD
        recorded only when it writes to some client, and an untrusted client's answer, dropped, makes it write to
        none: so while it waits, a round trip of the control connection's (0.25 ms apart, doubling up to 20) has it sent."""
        deadline = time.monotonic() + timeout_s
        pause = 0.00025
        while True:
            with self._cond:
                if self._wait_for(lambda: stamp in self._answered, min(pause, deadline - time.monotonic())):
                    return True
            if time.monotonic() >= deadline:
                return False
            self._control.get_input_focus()
            pause = min(pause * 2, 0.02)

    def end(self, context: int) -> None:
        """Stop and free ``context`` (its recording thread then takes the next)."""
        self._control.record_disable_context(context)
        self._control.record_free_context(context)
        self._control.flush()

    def close(self) -> None:
        """End the recording thread and close its connection."""
        self._contexts.put(None)
        self._thread.join(timeout=2.0)
        with contextlib.suppress(Exception):
            self._data.close()
        if self._thread.is_alive():
            logger.warning("the RECORD thread of %s did not end", self._thread.name)


class XInput:
    """Mouse and keyboard of one display. Thread-safe; every call returns after the server has the events."""

    def __init__(self, display_name: str) -> None:
        self._d = xdisplay.Display(display_name)
        if not self._d.has_extension("XTEST"):
            raise RuntimeError(f"display {display_name} has no XTEST extension")
        impervious_xlib(self._d)   # a desktop's app that grabs the X server stops no input (xgrabs.py)
        self._lock = threading.Lock()
        self._shift = self._d.keysym_to_keycode(XK.XK_Shift_L)
        self._spare = self._find_spare_keycodes()
        self._spare_next = 0
        screen = self._d.screen()
        self.width, self.height = screen.width_in_pixels, screen.height_in_pixels
        self._root = screen.root
        self._wm_protocols = self._d.intern_atom("WM_PROTOCOLS")
        self._client_list = self._d.intern_atom("_NET_CLIENT_LIST")
        self._ready_window = 0   # the focused client that last answered a ping
        self._ready_pings = False   # whether it takes pings
        self._ready_focus = 0    # the focus window (it or one of its children) when it was confirmed
        self._ping_lock = threading.Lock()
        self._pinger: tuple | None = None   # (connection, atoms, answers) for pings
        self._ping_stamp = 0
        try:   # now, not on first use: a connection opened while an app holds a server grab would wait for it
            self._ping_link()
        except BaseException:
            self._d.close()
            raise

    def close(self) -> None:
        with self._lock, self._ping_lock:
            if self._pinger:
                self._pinger[3].close()
            for d in (self._d, self._pinger and self._pinger[0]):
                try:
                    if d:
                        d.close()
                except Exception:  # the X server may already be gone
                    pass
            self._pinger = None

    # -- mouse --------------------------------------------------------------------------------------
    def move(self, x: int, y: int) -> None:
        with self._lock:
            xtest.fake_input(self._d, X.MotionNotify, x=int(x), y=int(y))
            self._d.sync()

    def button(self, button: int, press: bool) -> None:
        with self._lock:
            xtest.fake_input(self._d, X.ButtonPress if press else X.ButtonRelease, button)
            self._d.sync()

    def click(self, x: int, y: int, button: int = 1, count: int = 1) -> None:
        with self._lock:
            xtest.fake_input(self._d, X.MotionNotify, x=int(x), y=int(y))
            for _ in range(count):
                xtest.fake_input(self._d, X.ButtonPress, button)
                xtest.fake_input(self._d, X.ButtonRelease, button)
            self._d.sync()

    def scroll(self, x: int, y: int, dx: int, dy: int) -> None:
        """Scroll notches: dy > 0 scrolls down (button 5), dx > 0 right (button 7)."""
        with self._lock:
            xtest.fake_input(self._d, X.MotionNotify, x=int(x), y=int(y))
            for amount, neg, pos in ((dy, 4, 5), (dx, 6, 7)):
                for _ in range(abs(amount)):
                    b = pos if amount > 0 else neg
                    xtest.fake_input(self._d, X.ButtonPress, b)
                    xtest.fake_input(self._d, X.ButtonRelease, b)
            self._d.sync()

    # -- keyboard target ----------------------------------------------------------------------------
    # Keys go to the window that holds the X input focus. A window manager focuses a new window (or the one
    # just clicked) some time after it maps (or is clicked); keys sent before that are lost, and so are
    # keys a just-started client receives before its event loop runs. Under load both windows grow to
    # hundreds of ms (seen: a cold mousepad missing the first typed characters, a Chromium page missing
    # the keys typed right after a click). So keyboard input first waits until a viewable client window
    # holds the focus and that client has answered a _NET_WM_PING (it has processed every event before it; its
    # answer is read through RECORD, ``_PingAnswers``).
    def _client_of(self, win) -> int:
        """The id of the viewable top-level client window at or above ``win`` (the input focus); 0 when none."""
        if isinstance(win, int):      # None or PointerRoot
            return 0
        while win.id != self._root.id:
            if win.get_full_property(self._wm_protocols, X.AnyPropertyType) is not None:
                return win.id if win.get_attributes().map_state == X.IsViewable else 0
            parent = win.query_tree().parent
            if isinstance(parent, int) or parent.id == 0:
                return 0
            win = parent
        return 0

    def _has_clients(self) -> bool:
        """Whether any viewable client window exists (a bare desktop has no keyboard target to wait for)."""
        prop = self._root.get_full_property(self._client_list, X.AnyPropertyType)
        for wid in (prop.value if prop else []):
            try:
                if self._d.create_resource_object("window", wid).get_attributes().map_state == X.IsViewable:
                    return True
            except xerror.XError:
                continue
        return False

    def _ping_link(self) -> tuple:
        """(connection, WM_PROTOCOLS, _NET_WM_PING, ``_PingAnswers``) for pings: a connection of its own and the
        recording of the answers, opened once (by ``__init__``)."""
        if self._pinger is None:
            d = xdisplay.Display(self._d.get_display_name())
            try:
                impervious_xlib(d)
                self._pinger = (d, d.intern_atom("WM_PROTOCOLS"), d.intern_atom("_NET_WM_PING"), _PingAnswers(d))
            except BaseException:
                d.close()
                raise
        return self._pinger

    def ping(self, window: int, timeout_s: float = PING_WAIT_S, takes_pings: bool = False) -> bool | None:
        """Send ``window``'s client a _NET_WM_PING and wait for its answer: True when it answered (it has
        processed every event sent to it before), False after ``timeout_s`` or when the window is gone,
        None when it does not take pings (not asked again when ``takes_pings`` says it does)."""
        with self._ping_lock:
            d, protocols, ping, answers = self._ping_link()
            try:
                win = d.create_resource_object("window", window)
                if not takes_pings:
                    prop = win.get_full_property(protocols, X.AnyPropertyType)
                    if prop is None or ping not in prop.value:
                        return None
                self._ping_stamp = (self._ping_stamp + 1) & 0xFFFFFFFF
                stamp = self._ping_stamp
                started = time.monotonic()
                if (context := answers.watch(window, timeout_s)) is None:
                    return False
            except xerror.XError:     # the window went away
                return False
            try:
                win.send_event(xevent.ClientMessage(window=win, client_type=protocols,
                                                    data=(32, [ping, stamp, window, 0, 0])), event_mask=0)
                d.flush()
                return answers.wait(stamp, timeout_s - (time.monotonic() - started))
            finally:
                answers.end(context)

    def pointer_client(self) -> int:
        """The id of the top-level client window under the pointer; 0 when there is none (the bare root, a popup
        without WM_PROTOCOLS). A pointer grab (a drag in progress) does not change what is under it."""
        with self._lock:
            try:
                win = self._root
                while True:
                    child = win.query_pointer().child
                    if isinstance(child, int) or child.id == X.NONE:
                        return 0
                    if child.get_full_property(self._wm_protocols, X.AnyPropertyType) is not None:
                        return child.id
                    win = child
            except xerror.XError:     # a window went away while we looked
                return 0

    def processed(self, window: int) -> bool | None:
        """Wait until ``window``'s client has handled every event sent to it so far (``ping``); None when there
        is no such window or it takes no pings."""
        return self.ping(window) if window else None

    def keys_processed(self, timeout_s: float = PING_WAIT_S) -> float | bool | None:
        """Wait until the client that took the keys typed since ``keyboard_ready`` (the focused client it
        confirmed) has processed them: the ``time.monotonic()`` of its answer to a ping; False when it did not
        answer within ``timeout_s`` (a busy or stopped client) or its window is gone; None when there is no such
        client or it takes no pings."""
        window = self._ready_window
        if not (window and self._ready_pings):
            return None
        if not self.ping(window, timeout_s, takes_pings=True):
            return False
        return time.monotonic()

    def focus_unmoved(self) -> bool:
        """One round trip, no waiting: the input focus is on the very window it was on when ``keyboard_ready``
        last confirmed its client. X keeps the focus on a viewable window only, so that client still is."""
        with self._lock:
            try:
                focus = self._d.get_input_focus().focus
            except xerror.XError:
                return False
        return self._confirmed(focus)

    def _confirmed(self, focus) -> bool:
        """``focus`` (a GetInputFocus answer) is the window ``keyboard_ready`` last confirmed the client of."""
        return not isinstance(focus, int) and focus.id == self._ready_focus != 0

    def keyboard_ready(self) -> bool:
        """True once keys would reach a live client: a viewable client window holds the focus and its client
        answered a ping since it got it (or takes no pings), or the desktop has no client window at all."""
        with self._lock:
            try:
                focus = self._d.get_input_focus().focus
                if self._confirmed(focus):
                    return True
                window = self._client_of(focus)
                if not window:
                    return not self._has_clients()
            except xerror.XError:  # a window went away while we looked
                return False
        if window != self._ready_window:
            answer = self.ping(window)
            if answer is False:
                return False
            self._ready_window, self._ready_pings = window, answer is True
        self._ready_focus = focus.id
        return True

    # -- keyboard -----------------------------------------------------------------------------------
    def _find_spare_keycodes(self) -> list[int]:
        first = self._d.display.info.min_keycode
        count = self._d.display.info.max_keycode - first + 1
        mapping = self._d.get_keyboard_mapping(first, count)
        spare = [first + i for i, syms in enumerate(mapping) if not any(syms)]
        return spare[-4:]  # a few, used round-robin so a remap never races the previous key

    def _mapped(self, keysym: int) -> tuple[int, bool] | None:
        """(keycode, needs_shift) for a keysym in the current keymap; None when it has no key there."""
        for code, index in self._d.keysym_to_keycodes(keysym):
            if index in (0, 1):
                return code, index == 1
        return None

    def presses(self, keysyms: list[int], combo: bool = False) -> int:
        """How many keys ``type_text`` (or, with ``combo``, ``key_combo``) presses for ``keysyms``: a shifted
        character adds Shift's press (a combo adds it only for a single key, as ``key_combo`` does)."""
        return len(keysyms) + sum(_adds_shift(bool((m := self._mapped(sym)) and m[1]), len(keysyms), combo)
                                  for sym in keysyms)

    def _keycode(self, keysym: int) -> tuple[int, bool]:
        """(keycode, needs_shift) for a keysym, remapping a spare keycode when the keymap lacks it."""
        if (mapped := self._mapped(keysym)) is not None:
            return mapped
        if not self._spare:
            raise ValueError(f"no key for keysym {keysym:#x} and no spare keycode")
        code = self._spare[self._spare_next % len(self._spare)]
        self._spare_next += 1
        self._d.change_keyboard_mapping(code, [(keysym, keysym)])
        self._d.sync()
        time.sleep(0.005)  # clients must see the MappingNotify before the key event
        return code, False

    def key_combo(self, keysyms: list[int]) -> None:
        """Press the keys in order and release them in reverse (e.g. ctrl, shift, n)."""
        with self._lock:
            codes: list[int] = []
            for sym in keysyms:
                code, shift = self._keycode(sym)
                if _adds_shift(shift, len(keysyms), combo=True):
                    codes.append(self._shift)
                codes.append(code)
            for code in codes:
                xtest.fake_input(self._d, X.KeyPress, code)
            for code in reversed(codes):
                xtest.fake_input(self._d, X.KeyRelease, code)
            self._d.sync()

    def type_text(self, text: str) -> None:
        with self._lock:
            for ch in text:
                code, shift = self._keycode(char_keysym(ch))
                if shift:
                    xtest.fake_input(self._d, X.KeyPress, self._shift)
                xtest.fake_input(self._d, X.KeyPress, code)
                xtest.fake_input(self._d, X.KeyRelease, code)
                if shift:
                    xtest.fake_input(self._d, X.KeyRelease, self._shift)
            self._d.sync()

    def clear_selections(self) -> None:
        """Leave the X selections (the clipboard, the primary and secondary selection) without an owner: what a
        client copied or selected is gone (its owner is told and drops it), and a paste or middle click pastes
        nothing, as on a new X server."""
        with self._lock:
            for name in SELECTIONS:
                request.SetSelectionOwner(display=self._d.display, window=X.NONE, selection=self._d.intern_atom(name),
                                          time=X.CurrentTime)
            self._d.sync()

    def reset_modifiers(self) -> None:
        """Release every modifier and turn Caps Lock off (used after a failed combo)."""
        with self._lock:
            for name in ("Control_L", "Alt_L", "Shift_L", "Super_L"):
                code = self._d.keysym_to_keycode(XK.string_to_keysym(name))
                if code:
                    xtest.fake_input(self._d, X.KeyRelease, code)
            self._d.sync()
