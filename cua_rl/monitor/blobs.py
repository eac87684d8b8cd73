"""Content-addressed screenshot files: ``<root>/<sha[:2]>/<sha>.<ext>``, written once, never in the database.

Why by hash: a turn references the exact image the model saw by its SHA-256, which both proves what was
seen and stores an unchanged screen once however many turns show it. Writes go to a temporary file and
are renamed into place, so a reader never sees half a screenshot and concurrent uploads of the same
image are harmless.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_BLOB_BYTES = 16 * 1024 * 1024
_KINDS = ((b"\x89PNG\r\n\x1a\n", "png", "image/png"), (b"\xff\xd8\xff", "jpg", "image/jpeg"),
          (b"RIFF", "webp", "image/webp"))


class BlobError(ValueError):
    """Bad upload (status 400/413): wrong hash, not an image, too large."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def image_kind(data: bytes) -> tuple[str, str] | None:
    """(extension, media type) of a PNG, JPEG or WebP file, else None."""
    for magic, ext, media in _KINDS:
        if data.startswith(magic) and (ext != "webp" or data[8:12] == b"WEBP"):
            return ext, media
    return None


class BlobStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def put(self, sha256: str, data: bytes) -> bool:
        """Store ``data`` under its hash; True when newly written. Raises ``BlobError`` on bad input."""
        if not SHA256_RE.match(sha256):
            raise BlobError("the blob name must be a lowercase hex SHA-256 (64 characters)")
        if len(data) > MAX_BLOB_BYTES:
            raise BlobError(f"blob of {len(data)} bytes exceeds the limit of {MAX_BLOB_BYTES}", 413)
        kind = image_kind(data)
        if kind is None:
            raise BlobError("only PNG, JPEG or WebP images are accepted")
        actual = sha256_hex(data)
        if actual != sha256:
            raise BlobError(f"content hash {actual} does not match the name {sha256}")
        if self.find(sha256) is not None:
            return False
        folder = self.root / sha256[:2]
        folder.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".upload-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, folder / f"{sha256}.{kind[0]}")
        return True

    def find(self, sha256: str) -> tuple[Path, str] | None:
        """(path, media type) of a stored blob, or None."""
        if not SHA256_RE.match(sha256):
            return None
        for _magic, ext, media in _KINDS:
            path = self.root / sha256[:2] / f"{sha256}.{ext}"
            if path.is_file():
                return path, media
        return None
