"""Compression bombs a hostile third-party server answers with, and a measure of what one costs the process that
reads it: the tests of every client that reads another service's answers (issue 80: 589 bytes of ``gzip, gzip``
raised the agent service to 596 MB before its 8 MiB bound was checked).

``compression_bomb(coding)``: a body that decodes to ``mib`` MiB of zeros under ``Content-Encoding: coding``
(``gzip, gzip`` or ``zstd``; the zstd one skips the test where ``zstandard`` is not installed), built without
holding the zeros. ``peak_rss_growth()``: how far this process's peak RSS rose within the block.
"""

from __future__ import annotations

import contextlib
import functools
import zlib

import pytest

MiB = 1 << 20
BOMB_MIB = 128          # what a bomb decodes to
MAX_GROWTH = 64 * MiB   # the peak RSS a client may gain while refusing one
CODINGS = ("gzip, gzip", "zstd")


def _gzip(chunks) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)   # wbits 31: the gzip format
    return b"".join([compressor.compress(c) for c in chunks] + [compressor.flush()])


@functools.cache
def compression_bomb(coding: str, mib: int = BOMB_MIB) -> bytes:
    zeros = (bytes(MiB) for _ in range(mib))
    if coding == "gzip, gzip":
        return _gzip([_gzip(zeros)])
    if coding != "zstd":
        raise ValueError(f"no bomb for {coding!r}")
    zstandard = pytest.importorskip("zstandard")
    compressor = zstandard.ZstdCompressor(level=19).compressobj()
    return b"".join([compressor.compress(c) for c in zeros] + [compressor.flush()])


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


@contextlib.contextmanager
def peak_rss_growth():
    """Yields a dict whose ``bytes`` is, on exit, how far this process's peak RSS rose above its RSS at entry
    (the peak is reset first through ``/proc/self/clear_refs``; the test is skipped where that is refused)."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError as exc:
        pytest.skip(f"cannot reset the peak RSS here ({exc})")
    grown = {"bytes": 0}
    before = _status_kib("VmRSS")
    try:
        yield grown
    finally:
        grown["bytes"] = (_status_kib("VmHWM") - before) * 1024
