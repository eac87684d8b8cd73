"""Helpers shared by the policy tests (plain module: pytest puts this directory on sys.path)."""

import base64
import io

from PIL import Image


def png_data_url(color=(200, 30, 30), size=(320, 200), text_box=True) -> str:
    img = Image.new("RGB", size, color)
    if text_box:  # some structure, so different screenshots give different pixel values
        for x in range(10, 60):
            for y in range(10, 30):
                img.putpixel((x, y), (255 - color[0], 255 - color[1], 255 - color[2]))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
