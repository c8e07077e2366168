"""A minimal RFC 6455 WebSocket client, for session attachments.

Why by hand: the standard library has no WebSocket client, no package index
is reachable where this SDK is built and tested, and Debian bookworm's
``python3-websockets`` (10.4) has no synchronous client and is not in every
guest image; the SDK must import with Python 3.11 alone. Sessions need only
a small part of the protocol, which is what this module implements:

- the opening handshake over a plain or TLS socket, with a random
  ``Sec-WebSocket-Key`` whose ``Sec-WebSocket-Accept`` is checked, the key
  in ``X-Api-Key`` and the subprotocol ``strata.v1``; the answer's
  ``Upgrade`` and ``Connection`` headers checked; a refusal (any status
  but 101) is read as the API's JSend answer (its body by Content-Length
  or chunked, at most 1 MiB) and raised as StrataError; a failure of the
  network, TLS or a timeout during the handshake is StrataError
  ``network_error``;
- masked client frames (binary and text), unmasked server frames (a
  masked one is a protocol error);
- fragmented messages (continuation frames) put back together;
- a ping answered with a pong carrying the same payload;
- the close handshake, with a code and a reason, both ways (1005, 1006 and
  1015 are never sent; a 1-byte close payload is a protocol error; a ping
  that comes after our close is not answered);
- a bound on each frame (64 KiB of payload, the attachment's own limit, plus
  the header) and on each message.

No extensions (permessage-deflate) are offered.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import socket
import ssl
import struct
import threading
import urllib.parse

from ._client import error_from
from ._errors import StrataError

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
MAX_FRAME = 64 * 1024  # payload bytes of one frame, either way
MAX_MESSAGE = 16 * 1024 * 1024

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_NO_STATUS = 1005
CLOSE_ABNORMAL = 1006
CLOSE_TLS = 1015
NEVER_SENT = frozenset({CLOSE_NO_STATUS, CLOSE_ABNORMAL, CLOSE_TLS})  # reserved: only reported, never in a frame


class WebSocketClosed(Exception):
    """The connection ended: by a close frame (``code``, ``reason``), or
    broken without one (``code`` 1006)."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"websocket closed ({code}){': ' + reason if reason else ''}")
        self.code = code
        self.reason = reason


class WebSocket:
    """One client connection. ``recv()`` returns whole messages; ``send_*``
    may be called from another thread than ``recv()`` (sends are locked)."""

    def __init__(self, sock: socket.socket, leftover: bytes, subprotocol: str | None) -> None:
        self._sock = sock
        self._buf = bytearray(leftover)
        self._send_lock = threading.Lock()
        self._closed_sent = False
        self.closed: WebSocketClosed | None = None
        self.subprotocol = subprotocol

    # -- opening ----------------------------------------------------------

    @classmethod
    def connect(
        cls,
        url: str,
        headers: dict[str, str] | None = None,
        subprotocols: list[str] | None = None,
        timeout: float | None = 30.0,
    ) -> "WebSocket":
        """Open a connection to ``ws://`` or ``wss://`` (or ``http(s)://``)
        url. A refused upgrade raises StrataError with the API's code; a
        failure of the network or of TLS, a timeout, or an answer that is no
        WebSocket upgrade, raises StrataError ``network_error`` (status 0)."""
        u = urllib.parse.urlsplit(url)
        secure = u.scheme in ("wss", "https")
        try:
            host = u.hostname or "localhost"
            port = u.port or (443 if secure else 80)
        except ValueError as e:  # a port that is not a number
            raise StrataError("network_error", f"websocket to {url!r}: {e}") from None
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        where = f"websocket to {host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except (OSError, ValueError) as e:
            raise StrataError("network_error", f"{where}: {e}") from None
        try:
            return cls._handshake(sock, u, host, port, secure, target, headers, subprotocols)
        except (OSError, ValueError, http.client.HTTPException) as e:  # reset, TLS, timeout, a garbled answer
            sock.close()
            raise StrataError("network_error", f"{where}: the handshake failed: {e!r}") from None
        except BaseException:
            sock.close()
            raise

    @classmethod
    def _handshake(
        cls,
        sock: socket.socket,
        u: urllib.parse.SplitResult,
        host: str,
        port: int,
        secure: bool,
        target: str,
        headers: dict[str, str] | None,
        subprotocols: list[str] | None,
    ) -> "WebSocket":
        if secure:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        key = base64.b64encode(os.urandom(16)).decode()
        hostname = f"[{host}]" if ":" in host else host  # an IPv6 address
        hosthdr = hostname if u.port is None else f"{hostname}:{port}"
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {hosthdr}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if subprotocols:
            lines.append("Sec-WebSocket-Protocol: " + ", ".join(subprotocols))
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                raise StrataError("network_error", "websocket: the connection closed during the handshake")
            buf += chunk
            if len(buf) > 65536:
                raise StrataError("network_error", "websocket: handshake answer too long")
        head, rest = buf.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        hdrs: dict[str, str] = {}
        for line in header_lines:
            if ":" in line:
                k, v = line.split(":", 1)
                k = k.strip().lower()
                hdrs[k] = f"{hdrs[k]}, {v.strip()}" if k in hdrs else v.strip()
        if status == 0:
            raise StrataError("network_error", f"websocket: the answer is not HTTP: {status_line[:100]!r}")
        if status != 101:
            raise error_from(status, hdrs, _refusal_body(sock, hdrs, rest), "GET", u.path)
        expect = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        if hdrs.get("sec-websocket-accept") != expect:
            raise StrataError("network_error", "websocket: the server's Sec-WebSocket-Accept does not match the key")
        if "websocket" not in hdrs.get("upgrade", "").lower():
            raise StrataError("network_error", "websocket: the server did not upgrade to websocket")
        if "upgrade" not in [t.strip().lower() for t in hdrs.get("connection", "").split(",")]:
            raise StrataError("network_error", "websocket: the server's answer has no Connection: Upgrade")
        proto = hdrs.get("sec-websocket-protocol")
        if subprotocols and proto and proto not in subprotocols:
            raise StrataError("network_error", f"websocket: the server chose subprotocol {proto!r}, not offered")
        if hdrs.get("sec-websocket-extensions"):
            raise StrataError("network_error", "websocket: the server chose an extension that was not offered")
        sock.settimeout(None)
        return cls(sock, rest, proto)

    # -- frames -----------------------------------------------------------

    def _read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                chunk = self._sock.recv(max(65536, n - len(self._buf)))
            except OSError as e:
                raise WebSocketClosed(CLOSE_ABNORMAL, f"connection broken: {e}") from None
            if not chunk:
                raise WebSocketClosed(CLOSE_ABNORMAL, "connection closed without a close frame")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _read_frame(self) -> tuple[bool, int, bytes]:
        b0, b1 = self._read_exact(2)
        fin = bool(b0 & 0x80)
        if b0 & 0x70:
            self._fail(CLOSE_PROTOCOL_ERROR, "reserved bits set")
        opcode = b0 & 0x0F
        if b1 & 0x80:  # RFC 6455 5.1: a server never masks its frames
            self._fail(CLOSE_PROTOCOL_ERROR, "a masked frame from the server")
        length = b1 & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", self._read_exact(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", self._read_exact(8))
        if length > MAX_FRAME + 16:
            self._fail(CLOSE_TOO_BIG, f"frame of {length} bytes over the limit")
        payload = self._read_exact(length)
        if opcode >= 0x8 and (not fin or length > 125):
            self._fail(CLOSE_PROTOCOL_ERROR, "bad control frame")
        return fin, opcode, payload

    def _fail(self, code: int, reason: str) -> None:
        try:
            self.close(code, reason)
        finally:
            self._sock.close()
        raise WebSocketClosed(code, reason)

    def recv(self) -> tuple[int, bytes]:
        """The next whole message: (``OP_TEXT`` or ``OP_BINARY``, payload).
        Pings are answered; a close frame is answered and raises
        WebSocketClosed with its code and reason, as does a broken
        connection (1006)."""
        if self.closed is not None:
            raise self.closed
        opcode: int | None = None
        parts: list[bytes] = []
        size = 0
        try:
            while True:
                fin, op, payload = self._read_frame()
                if op == OP_PING:
                    if not self._closed_sent:  # after our close, no pong: skipped
                        try:
                            self._send_frame(OP_PONG, payload)
                        except WebSocketClosed:
                            if not self._closed_sent:
                                raise
                    continue
                if op == OP_PONG:
                    continue
                if op == OP_CLOSE:
                    if len(payload) == 1:
                        self._fail(CLOSE_PROTOCOL_ERROR, "a close frame with a 1-byte payload")
                    code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else CLOSE_NO_STATUS
                    reason = payload[2:].decode("utf-8", "replace")
                    # Answer with the same code, but never one that must not
                    # be sent (1005, 1006, 1015: close() makes them 1000).
                    try:
                        self.close(code)
                    except OSError:
                        pass
                    self._sock.close()
                    raise WebSocketClosed(code, reason)
                if op == OP_CONT:
                    if opcode is None:
                        self._fail(CLOSE_PROTOCOL_ERROR, "continuation without a message")
                elif op in (OP_TEXT, OP_BINARY):
                    if opcode is not None:
                        self._fail(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
                    opcode = op
                else:
                    self._fail(CLOSE_PROTOCOL_ERROR, f"unknown opcode {op}")
                parts.append(payload)
                size += len(payload)
                if size > MAX_MESSAGE:
                    self._fail(CLOSE_TOO_BIG, "message over the limit")
                if fin:
                    assert opcode is not None
                    return opcode, b"".join(parts)
        except WebSocketClosed as c:
            self.closed = c
            raise

    def _send_frame(self, opcode: int, payload: bytes, fin: bool = True) -> None:
        header = bytearray([(0x80 if fin else 0) | opcode])
        n = len(payload)
        if n < 126:
            header.append(0x80 | n)
        elif n < 65536:
            header.append(0x80 | 126)
            header += struct.pack("!H", n)
        else:
            header.append(0x80 | 127)
            header += struct.pack("!Q", n)
        mask = os.urandom(4)
        header += mask
        with self._send_lock:
            if self._closed_sent:
                raise WebSocketClosed(self.closed.code if self.closed else CLOSE_NORMAL, "closed")
            if opcode == OP_CLOSE:
                self._closed_sent = True
            try:
                self._sock.sendall(bytes(header) + _mask(payload, mask))
            except OSError as e:
                raise WebSocketClosed(CLOSE_ABNORMAL, f"connection broken: {e}") from None

    def send_binary(self, data: bytes) -> None:
        """Send one binary message (in frames of at most 64 KiB)."""
        self._send_message(OP_BINARY, data)

    def send_text(self, text: str) -> None:
        """Send one text message."""
        self._send_message(OP_TEXT, text.encode("utf-8"))

    def _send_message(self, opcode: int, data: bytes) -> None:
        if len(data) <= MAX_FRAME:
            self._send_frame(opcode, data)
            return
        for i in range(0, len(data), MAX_FRAME):
            part = data[i : i + MAX_FRAME]
            self._send_frame(opcode if i == 0 else OP_CONT, part, fin=i + MAX_FRAME >= len(data))

    def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        """Send a close frame (once); the peer's answer is read by recv()."""
        if self._closed_sent:
            return
        if code in NEVER_SENT or not 1000 <= code <= 4999:
            code = CLOSE_NORMAL
        payload = struct.pack("!H", code) + reason.encode("utf-8")[:123]
        try:
            self._send_frame(OP_CLOSE, payload)
        except WebSocketClosed:
            pass

    def shutdown(self) -> None:
        """Close the socket at once (after close(), or instead of it)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


MAX_REFUSAL = 1 << 20  # bytes of a refused handshake's body kept, at most
RECV_AT_MOST = 64 * 1024


def _refusal_body(sock: socket.socket, hdrs: dict[str, str], rest: bytes) -> bytes:
    """The body of a refused handshake (for its JSend code), at most
    MAX_REFUSAL bytes: by Content-Length, by chunked encoding, or (with
    ``Connection: close``) to the end. A body that breaks off, or a header
    that makes no sense, yields what was read: the error is then made of
    the status alone."""
    buf = bytearray(rest)

    def more() -> bool:
        try:
            chunk = sock.recv(RECV_AT_MOST)
        except OSError:
            return False
        buf.extend(chunk)
        return bool(chunk)

    if "chunked" in hdrs.get("transfer-encoding", "").lower():
        out = bytearray()
        pos = 0
        while len(out) < MAX_REFUSAL:
            while b"\r\n" not in buf[pos:]:
                if len(buf) - pos > 1024 or not more():
                    return bytes(out)
            eol = buf.index(b"\r\n", pos)
            try:
                size = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                return bytes(out)
            if size <= 0:
                return bytes(out)
            pos = eol + 2
            want = min(size, MAX_REFUSAL - len(out))
            while len(buf) - pos < want:
                if not more():
                    out += buf[pos:]
                    return bytes(out)
            out += buf[pos : pos + want]
            if want < size:
                break
            while len(buf) < pos + size + 2 and more():
                pass
            pos += size + 2  # the chunk and its CRLF
            del buf[:pos]
            pos = 0
        return bytes(out[:MAX_REFUSAL])
    length_text = hdrs.get("content-length", "").split(",")[0].strip()
    if length_text.isdigit():
        length = min(int(length_text), MAX_REFUSAL)
        while len(buf) < length and more():
            pass
        return bytes(buf[:length])
    if "close" in hdrs.get("connection", "").lower():
        while len(buf) < MAX_REFUSAL and more():
            pass
    return bytes(buf[:MAX_REFUSAL])


def _mask(data: bytes, mask: bytes) -> bytes:
    if not data:
        return b""
    n = len(data)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")
