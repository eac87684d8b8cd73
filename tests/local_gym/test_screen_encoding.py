"""Screenshots as the gym encodes them (cua_rl/local_gym/screen.py): PNG through zlib-ng from unfiltered rows,
JPEG through simplejpeg from the X server's BGRX frame. On a real Xvfb painted in many colours: the PNG holds
exactly the frame's pixels (lossless), also when only some of its stripes changed since the last PNG, the JPEG is Pillow's JPEG of the same frame within rounding (same
libjpeg quality tables and subsampling), and both open as images of the screen's size. The speed is
bench/screenshot_bench.py's."""

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from cua_rl.local_gym.screen import Screen
from gym_helpers import paint

pytestmark = pytest.mark.desktop


def test_png_is_the_frame_exactly_and_jpeg_is_pillows_within_rounding(x_display):
    screen = Screen(x_display)   # first: its connection keeps the server from resetting between the paints
    try:
        rng = np.random.default_rng(0)
        for i in range(40):   # rectangles of many colours, so a swapped channel or a shifted row shows
            x, y = (int(v) for v in rng.integers(0, 300, 2))
            paint(x_display, int(rng.integers(0, 0xFFFFFF)), x % 300, y % 180, 7 + i, 5 + i % 13)
        raw = screen.grab()
        frame = np.asarray(Image.frombuffer("RGB", (screen.width, screen.height), bytes(raw), "raw", "BGRX", 0, 1))
        assert len(np.unique(frame.reshape(-1, 3), axis=0)) > 20
        png = screen.encode(raw, "png")
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")), frame)
        jpeg = screen.encode(raw, "jpeg", 85)
        ours = Image.open(io.BytesIO(jpeg))
        assert ours.size == (screen.width, screen.height) and ours.format == "JPEG"
        pillow = io.BytesIO()
        Image.fromarray(frame).save(pillow, "JPEG", quality=85)
        diff = np.abs(np.asarray(ours, np.int16) - np.asarray(Image.open(pillow), np.int16))
        assert diff.mean() < 1.0 and diff.max() <= 40, (diff.mean(), diff.max())
        assert np.abs(np.asarray(ours, np.int16) - frame).mean() < 3   # and close to the frame itself

        # a small change re-encodes only its stripes: the file is still exactly the new frame, a valid zlib
        # stream (its Adler-32 checked by zlib), and the change undone gives the first file's pixels again
        paint(x_display, 0x123456, 5, 37, 30, 9)   # rows 37-45: stripes 2 and 3
        raw2 = screen.grab()
        png2 = screen.encode(raw2, "png")
        frame2 = np.asarray(Image.frombuffer("RGB", (screen.width, screen.height), bytes(raw2), "raw", "BGRX", 0, 1))
        assert not np.array_equal(frame2, frame)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(png2)).convert("RGB")), frame2)
        assert len(zlib.decompress(_idat(png2))) == screen.height * (1 + 3 * screen.width)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(screen.png(raw))).convert("RGB")), frame)
    finally:
        screen.close()


def _idat(png: bytes) -> bytes:
    """The PNG's one IDAT chunk's data."""
    at = png.index(b"IDAT")
    (size,) = struct.unpack(">I", png[at - 4:at])
    return png[at + 4:at + 4 + size]
