"""The gym's own X connections to a desktop are impervious to server grabs (XTEST's GrabControl).

Why: any client on a desktop's display may grab the whole X server (``XGrabServer``: python3 and libX11 are in
the sandbox), and while it holds the grab the server answers no other client. The gym grabs frames, sends input
and waits for damage on the event loop and on shared threads, so one grabbing desktop would stop every
execution's screenshots and actions and even the gym's SIGTERM. XTEST's GrabControl request exists for
exactly this (a test client that must keep working under grabs): a connection that sent it is served whatever
any other client grabs. Every connection the gym keeps to a desktop sends it right after connecting, before
the desktop's apps can have grabbed anything (``python-xlib``'s ``xtest_grab_control``; ``impervious_xcb`` for
the xcb connection mss grabs frames on, which has no binding for it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct

_X_XTEST_GRAB_CONTROL = 3   # XTEST's minor opcode for GrabControl (X11/extensions/xtestproto.h)


class _Extension(ctypes.Structure):          # xcb_extension_t
    _fields_ = (("name", ctypes.c_char_p), ("global_id", ctypes.c_int))


class _ProtocolRequest(ctypes.Structure):    # xcb_protocol_request_t
    _fields_ = (("count", ctypes.c_size_t), ("ext", ctypes.POINTER(_Extension)), ("opcode", ctypes.c_uint8),
                ("isvoid", ctypes.c_uint8))


class _IOVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


_XTEST = _Extension(b"XTEST", 0)   # libxcb keeps a pointer to it for the connection's life: one for all
_xcb: ctypes.CDLL | None = None


def _libxcb() -> ctypes.CDLL:
    global _xcb
    if _xcb is None:
        lib = ctypes.CDLL(ctypes.util.find_library("xcb") or "libxcb.so.1")
        lib.xcb_send_request.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_IOVec),
                                         ctypes.POINTER(_ProtocolRequest))
        lib.xcb_send_request.restype = ctypes.c_uint
        lib.xcb_flush.argtypes = (ctypes.c_void_p,)
        lib.xcb_connection_has_error.argtypes = (ctypes.c_void_p,)
        _xcb = lib
    return _xcb


def impervious_xlib(display) -> None:
    """Make a python-xlib ``Display`` impervious to server grabs (and wait until the server has it)."""
    display.xtest_grab_control(True)
    display.sync()


def impervious_xcb(conn) -> None:
    """Make an xcb connection (mss's: the ``xcb_connection_t`` as a ctypes structure, or a pointer to it)
    impervious to server grabs: XTEST GrabControl sent through ``xcb_send_request`` (which fills in the
    extension's major opcode and the request's length)."""
    lib = _libxcb()
    address = ctypes.c_void_p(ctypes.addressof(conn) if isinstance(conn, ctypes.Structure)
                              else ctypes.cast(conn, ctypes.c_void_p).value)
    body = ctypes.create_string_buffer(struct.pack("=4xB3x", 1), 8)   # header (filled by xcb), impervious, pad
    vector = (_IOVec * 3)()                  # xcb_send_request may use the two entries before the first one
    vector[2] = _IOVec(ctypes.cast(body, ctypes.c_void_p), 8)
    request = _ProtocolRequest(1, ctypes.pointer(_XTEST), _X_XTEST_GRAB_CONTROL, 1)
    sequence = lib.xcb_send_request(address, 0, ctypes.cast(ctypes.byref(vector, 2 * ctypes.sizeof(_IOVec)),
                                                           ctypes.POINTER(_IOVec)), ctypes.byref(request))
    lib.xcb_flush(address)
    if sequence == 0 or lib.xcb_connection_has_error(address):
        raise RuntimeError("could not make the screen's X connection impervious to server grabs")
