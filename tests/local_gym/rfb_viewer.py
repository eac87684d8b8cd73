"""A VNC viewer the way noVNC is one: RFB 3.8 over the live view's WebSocket (websockify), for tests that act as
a viewer of a live view: connect with a page's Origin, type keys, and ask for a file by UltraVNC's file
transfer (the extension x11vnc's ``-ultrafilexfer`` turns on: message type 7, libvncserver's rfbFileTransfer).

Only what the tests need: no pixels are requested, so the server sends nothing but answers to what is asked.
"""

from __future__ import annotations

import asyncio
import struct

import aiohttp

RETURN = 0xFF0D          # the Return key's keysym; printable ASCII characters are their own keysyms
FILE_TRANSFER = 7        # rfbFileTransfer, and its content types used here
FT_REQUEST, FT_HEADER, FT_PACKET, FT_END = 3, 4, 5, 6
NO_FILE = 0xFFFFFFFF     # the header's size when the server could not open the file


class RFBViewer:
    """One viewer connection: ``async with RFBViewer.open(ws_url, origin) as viewer``."""

    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._session, self._ws, self._buf = session, ws, b""

    @classmethod
    def open(cls, ws_url: str, origin: str) -> "_Opening":
        return _Opening(ws_url, origin)

    async def _recv(self, n: int, timeout_s: float) -> bytes | None:
        """Exactly ``n`` bytes from the server; None when it closed the connection or sent nothing in time."""
        while len(self._buf) < n:
            try:
                msg = await self._ws.receive(timeout=timeout_s)
            except asyncio.TimeoutError:
                return None
            if msg.type != aiohttp.WSMsgType.BINARY:
                return None
            self._buf += msg.data
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    async def _send(self, data: bytes) -> bool:
        try:
            await self._ws.send_bytes(data)
            return True
        except (ConnectionError, RuntimeError):   # the proxy or the server closed the connection
            return False

    async def handshake(self) -> str:
        """Version, no security, shared ClientInit; returns the desktop's name from ServerInit."""
        version = await self._recv(12, 10)
        assert version and version.startswith(b"RFB 003."), version
        await self._send(b"RFB 003.008\n")
        count = (await self._recv(1, 10))[0]
        types = await self._recv(count, 10)
        assert 1 in types, f"the server offers no 'None' security: {list(types)}"
        await self._send(b"\x01")
        assert await self._recv(4, 10) == b"\0\0\0\0", "security handshake failed"
        await self._send(b"\x01")                       # ClientInit: shared
        init = await self._recv(24, 10)
        name_len = struct.unpack(">I", init[20:24])[0]
        return (await self._recv(name_len, 10)).decode(errors="replace")

    async def type_text(self, text: str) -> None:
        """Key down and up for each character (``\\n`` is Return), as a viewer typing into the page."""
        for ch in text:
            sym = RETURN if ch == "\n" else ord(ch)
            for down in (1, 0):
                if not await self._send(struct.pack(">BBxxI", 4, down, sym)):
                    return

    async def fetch_file(self, path: str, timeout_s: float = 3.0) -> bytes | None:
        """The file at the server's ``path`` by UltraVNC file transfer: its bytes, or None when the server did
        not send it (file transfer off, the file refused, or the connection closed)."""
        name = b"C:" + path.encode()                   # "C:" + an absolute path: that path on a Unix server
        if not await self._send(struct.pack(">BBBxII", FILE_TRANSFER, FT_REQUEST, 0, 0, len(name)) + name):
            return None
        data = b""
        while True:
            head = await self._recv(1, timeout_s)
            if head is None:
                return None
            if head[0] == 2:                             # Bell
                continue
            if head[0] == 3:                             # ServerCutText
                rest = await self._recv(7, timeout_s)
                if rest is None or await self._recv(struct.unpack(">I", rest[3:])[0], timeout_s) is None:
                    return None
                continue
            if head[0] != FILE_TRANSFER:
                return None
            rest = await self._recv(11, timeout_s)
            if rest is None:
                return None
            kind, _param, size, length = struct.unpack(">BBxII", rest)
            body = await self._recv(length, timeout_s) if length else b""
            if body is None:
                return None
            if kind == FT_HEADER:
                await self._recv(4, timeout_s)           # the size's high 32 bits
                if size == NO_FILE:
                    return None
                await self._send(struct.pack(">BBBxII", FILE_TRANSFER, FT_HEADER, 0, 0, 0))   # "ready: send it"
            elif kind == FT_PACKET:
                data += body
            elif kind == FT_END:
                return data

    async def close(self) -> None:
        await self._ws.close()
        await self._session.close()


class _Opening:
    def __init__(self, ws_url: str, origin: str) -> None:
        self.ws_url, self.origin, self.viewer = ws_url, origin, None

    async def __aenter__(self) -> RFBViewer:
        session = aiohttp.ClientSession()
        try:
            ws = await session.ws_connect(self.ws_url, headers={"Origin": self.origin}, protocols=("binary",),
                                          timeout=aiohttp.ClientWSTimeout(ws_close=2))
        except BaseException:
            await session.close()
            raise
        self.viewer = RFBViewer(session, ws)
        return self.viewer

    async def __aexit__(self, *exc) -> None:
        await self.viewer.close()
