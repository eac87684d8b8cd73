"""X keysyms (what the action schema's key names and typed text become, ``xinput.keysym_for_name``) as QEMU
key codes (``qcode``s of QMP ``input-send-event``), for a US keyboard layout in the guest.

Why a table: a VM has no keymap to ask (X11 desktops look keys up in the X server's), so the gym sends the
physical key and Shift for what a US layout types with Shift. Characters that layout cannot type are
refused with ``InputRefused`` (the action answers ``ok: false``, the policy's fault), never sent as some other key.
"""

from __future__ import annotations

from Xlib import XK

from ..xinput import InputRefused

_UNSHIFTED = {" ": "spc", "-": "minus", "=": "equal", "[": "bracket_left", "]": "bracket_right",
              "\\": "backslash", ";": "semicolon", "'": "apostrophe", "`": "grave_accent", ",": "comma",
              ".": "dot", "/": "slash", "\n": "ret", "\t": "tab",
              **{c: c for c in "abcdefghijklmnopqrstuvwxyz0123456789"}}
# what Shift plus a key types on a US layout
_SHIFTED = dict(zip("!@#$%^&*()_+{}|:\"~<>?", "1234567890-=[]\\;'`,./"))
_NAMED = {"Return": "ret", "KP_Enter": "kp_enter", "Escape": "esc", "Tab": "tab", "BackSpace": "backspace",
          "Delete": "delete", "Insert": "insert", "space": "spc", "Up": "up", "Down": "down", "Left": "left",
          "Right": "right", "Home": "home", "End": "end", "Prior": "pgup", "Next": "pgdn",
          "Caps_Lock": "caps_lock", "Menu": "menu", "Print": "print", "Control_L": "ctrl", "Control_R": "ctrl_r",
          "Alt_L": "alt", "Alt_R": "alt_r", "Shift_L": "shift", "Shift_R": "shift_r", "Super_L": "meta_l",
          "Super_R": "meta_r", **{f"F{i}": f"f{i}" for i in range(1, 13)}}
_BY_KEYSYM = {XK.string_to_keysym(name): code for name, code in _NAMED.items()}
MODIFIERS = ("ctrl", "alt", "shift", "meta_l")


def char_qcode(ch: str) -> tuple[str, bool]:
    """(qcode, with Shift) that types ``ch``; ``InputRefused`` when a US layout has no key for it."""
    if ch in _UNSHIFTED:
        return _UNSHIFTED[ch], False
    if "A" <= ch <= "Z":
        return ch.lower(), True
    if ch in _SHIFTED:
        return _UNSHIFTED[_SHIFTED[ch]], True
    raise InputRefused(f"the VM keyboard (US layout) has no key for {ch!r}")


def keysym_qcode(sym: int) -> tuple[str, bool]:
    """(qcode, with Shift) of an X keysym."""
    if sym in _BY_KEYSYM:
        return _BY_KEYSYM[sym], False
    if 0x20 <= sym <= 0x7E:
        return char_qcode(chr(sym))
    raise InputRefused(f"the VM keyboard has no key for keysym {sym:#x}")
