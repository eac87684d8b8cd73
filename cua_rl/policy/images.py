"""Image parts of an OpenAI chat request -> decoded images plus the exact bytes the engine must see.

Why keep the bytes: the training row's ``pixel_values`` come from *our* processor run on the decoded image,
while vLLM decodes the image again on its side from what we forward. Forwarding the agent's original bytes
(base64, unchanged) means both sides decode the same file, so the pixels the policy sampled from are the
pixels we train on.

Remote images: our agents send data URLs, and an endpoint that fetches any URL it is given lets whoever holds
an episode key make requests from the training host (and map its network by the errors). So http(s) URLs are
refused unless their host is in ``policy.allowed_image_hosts`` (vLLM's ``--allowed-media-domains``), with no
request made: one message when the list is empty, the refused host named when it is not; a URL of a listed host
is fetched once with a size and a time cap, and every failure reads the same (``FETCH_FAILED``; the cause goes
to the log), so an answer never tells an open port from a closed one. Anything else (a path, ``file:``) is
refused: an image is never read from disk.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from PIL import Image, UnidentifiedImageError

logger = logging.getLogger(__name__)

# 8K UHD: no screen the agent photographs is larger. Checked on the header, before any pixel is decoded, so a
# small file declaring a huge image (a decompression bomb) costs nothing; PIL's own guard is 5x higher.
MAX_IMAGE_PIXELS = 7680 * 4320
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,(?P<data>.*)$", re.S)


class BadImage(ValueError):
    """An image part that cannot be used; the message says which one and why (becomes HTTP 400)."""


@dataclass(frozen=True)
class ImageFetchLimits:
    """Caps for images given as http(s) URLs (data URLs are capped by ``max_bytes`` too)."""

    max_bytes: int = 20 * 1024 * 1024
    timeout_s: float = 15.0
    allowed_hosts: tuple[str, ...] = ()   # hosts whose http(s) image URLs are fetched (lower case); () = none


@dataclass(frozen=True)
class DecodedImage:
    """One image as the agent sent it: ``b64`` is the original file, base64 (no data-URL prefix)."""

    b64: str
    image: Image.Image
    source: str  # "data" or the URL's scheme, for logs (never the payload itself)


def image_url_of(part: dict) -> str | None:
    """The URL of an image content part, or None if ``part`` is not an image part.

    Accepts OpenAI's ``{"type":"image_url","image_url":{"url":...}}`` (also a bare string), and the
    ``{"type":"image","url"|"image":...}`` shape gbox-mini-agent steps use.
    """
    kind = part.get("type")
    if kind == "image_url":
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, dict) else value
    elif kind in ("image", "input_image"):
        url = part.get("url") or part.get("image") or part.get("image_url")
        if isinstance(url, dict):
            url = url.get("url")
    else:
        return None
    if not isinstance(url, str) or not url.strip():
        raise BadImage(f"{kind} content part has no URL")
    return url.strip()


def _open(raw: bytes, what: str) -> Image.Image:
    try:
        img = Image.open(io.BytesIO(raw))
        if img.width * img.height > MAX_IMAGE_PIXELS:
            raise BadImage(f"{what}: {img.width}x{img.height} is {img.width * img.height} pixels; at most "
                           f"{MAX_IMAGE_PIXELS} (8K UHD) are accepted")
        img.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise BadImage(f"{what}: not a decodable image ({exc})") from exc
    return img.convert("RGB") if img.mode != "RGB" else img


def decode_data_url(url: str, limits: ImageFetchLimits) -> DecodedImage:
    match = _DATA_URL.match(url)
    if not match:
        raise BadImage("data URL is not base64 (expected data:<mime>;base64,<data>)")
    b64 = re.sub(r"\s+", "", match.group("data"))
    if len(b64) * 3 // 4 > limits.max_bytes:
        raise BadImage(f"data URL image exceeds {limits.max_bytes} bytes")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadImage(f"data URL has invalid base64 ({exc})") from exc
    return DecodedImage(b64=b64, image=_open(raw, "data URL"), source="data")


NOT_A_DATA_URL = ("an image must be a data: URL (data:image/png;base64,...); http(s) image URLs are refused unless "
                  "their host is in policy.allowed_image_hosts, and paths are never read")
FETCH_FAILED = "the image URL could not be fetched as an image (the endpoint's log says why)"


async def fetch_http_image(url: str, session: aiohttp.ClientSession, limits: ImageFetchLimits) -> DecodedImage:
    """The image at an http(s) ``url`` whose host ``limits.allowed_hosts`` lists; without a request
    ``BadImage(NOT_A_DATA_URL)`` when the list is empty and a ``BadImage`` naming the host when it is not there,
    ``BadImage(FETCH_FAILED)`` for every failure of a listed host (module docstring)."""
    if not limits.allowed_hosts:
        raise BadImage(NOT_A_DATA_URL)
    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        host = ""
    if host not in limits.allowed_hosts:
        raise BadImage(f"the image URL's host {host!r} is not in policy.allowed_image_hosts "
                       f"({', '.join(limits.allowed_hosts)}); nothing was fetched")
    timeout = aiohttp.ClientTimeout(total=limits.timeout_s)
    try:
        async with session.get(url, timeout=timeout, allow_redirects=False) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            if resp.content_length is not None and resp.content_length > limits.max_bytes:
                raise ValueError(f"the body exceeds {limits.max_bytes} bytes")
            buf = bytearray()
            async for chunk in resp.content.iter_chunked(65536):
                buf.extend(chunk)
                if len(buf) > limits.max_bytes:
                    raise ValueError(f"the body exceeds {limits.max_bytes} bytes")
        raw = bytes(buf)
        image = _open(raw, "image URL")
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:   # BadImage (not an image) is a ValueError
        logger.info("image URL not used: %s: %s", type(exc).__name__, exc)
        raise BadImage(FETCH_FAILED) from None
    scheme = url.split(":", 1)[0].lower()
    return DecodedImage(b64=base64.b64encode(raw).decode("ascii"), image=image, source=scheme)


def grid_size(width: int, height: int, factor: int, min_pixels: float, max_pixels: float) -> tuple[int, int]:
    """(width, height) an image of this size takes on a Qwen-VL patch grid: both sides multiples of ``factor``
    (patch size x merge size), the area within [min_pixels, max_pixels], the aspect ratio kept as closely as that
    allows. The Qwen-VL image processors' own rule (``smart_resize`` in transformers' qwen2_vl image processing),
    so an image already at its grid size is left as it is by them."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return max(factor, w_bar), max(factor, h_bar)


def fit_pixels(decoded: DecodedImage, min_pixels: int | None, max_pixels: float | None,
               factor: int | None = None) -> DecodedImage:
    """The image the engine is sent: resampled at most once, and not at all when it needs no resize.

    With the processor's grid ``factor`` (and bounds that already include the processor's own, ``prompt.fit_for``):
    an image whose grid rounding stays within the bounds is returned as it is (the agent's own bytes; a processor
    rounds it to its grid, the same way on our side and vLLM's, at most one resampling); any other is resized
    once, straight to its grid size within the bounds, and re-encoded as PNG, which the processors then keep as
    it is. Without a factor (a processor that is not a Qwen-VL one) it is scaled into the bounds.

    Why here and not in the processor's settings: the inference server runs its own processor on the bytes we
    forward. Resizing the image itself means both processors see the same pixels; changing our processor's
    limits alone would not.
    """
    w, h = decoded.image.size
    low, high = min_pixels or 0, max_pixels or math.inf
    if factor:
        size = grid_size(w, h, factor, low, high)
        rounded = (round(w / factor) * factor, round(h / factor) * factor)   # the processor's own rounding
        if size == rounded:
            return decoded
    elif low <= w * h <= high:
        return decoded
    else:
        scale = math.sqrt((high if w * h > high else low) / (w * h))
        size = (max(1, int(w * scale)), max(1, int(h * scale)))
    img = decoded.image.resize(size, Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    # Decode what we send, so our pixels are exactly the engine's (PNG is lossless, this is a no-op copy).
    return DecodedImage(b64=base64.b64encode(buf.getvalue()).decode("ascii"), image=img, source=decoded.source)
