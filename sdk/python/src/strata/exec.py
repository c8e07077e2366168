"""Commands in a sandbox: one-shot ``run`` and streaming sessions.

``sb.exec.run(cmd)`` is the one-shot ``POST …/exec``: the command's whole
result in one answer. ``sb.exec.start(cmd)`` starts a *session*
(``POST …/sessions``) whose streams come through a WebSocket attachment
(``GET …/sessions/{sid}/attach``): iterate its output, write its stdin,
resize its terminal, signal it, wait for its exit code.

A memory snapshot, a pause or a restore of the sandbox ends every attachment
with close code 1011. A Session attaches again by itself (as ``createos``
does, see cmd/createos/internal/cli/session.go ``follow``): for up to 55 s
while the answer is 409 or 503 or the network fails (not when the sandbox is
``paused``, ``stopped`` or in ``error``: that does not end by itself), with
``?since=`` the output offset reached (stdout and stderr bytes received,
plus the ``bytes`` of any ``dropped`` message), so no output is lost or
repeated; stdin written during the gap is sent once attached again.

Every attachment names the generation of the session's record
(``?generation=``, docs/api.md "Generations"): when the sandbox was
restored or forked in between, the session is another run of the
snapshot's, and the attachment is refused; the Session then ends with
StrataError ``session_restored`` rather than give that run's output after
its own (``sb.exec.attach(id, since=…)`` follows the new run).
"""

from __future__ import annotations

import base64
import json
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping, NamedTuple, Sequence

from ._client import quote
from ._errors import StrataError
from ._records import Record
from ._websocket import CLOSE_INTERNAL, CLOSE_NORMAL, OP_BINARY, OP_TEXT, WebSocket, WebSocketClosed

if TYPE_CHECKING:
    from .sandbox import Sandbox

STREAM_STDIN, STREAM_STDOUT, STREAM_STDERR = 0, 1, 2
SUBPROTOCOL = "strata.v1"
REATTACH_FOR = 55.0  # guestd holds a session 60 s for an attachment to come again
MAX_STDIN_CHUNK = 64 * 1024 - 1  # one frame: the stream byte and the data

Command = str | Sequence[str]


def argv(command: Command) -> list[str]:
    """A str runs with ``sh -c``; a list (or tuple) runs as it is."""
    if isinstance(command, str):
        return ["sh", "-c", command]
    cmd = list(command)
    if not cmd or not all(isinstance(c, str) for c in cmd):
        raise StrataError("invalid_argument", "a command is a string or a non-empty list of strings", 0, {"field": "cmd"})
    return cmd


MAX_RUN_STDIN = 1 << 20


def _stdin_text(stdin: str | bytes | bytearray | memoryview) -> str:
    """exec.run's stdin as the API takes it: text of at most 1 MiB (UTF-8)."""
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        raw = bytes(stdin)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise StrataError(
                "invalid_argument",
                f"stdin is not UTF-8 text (byte {e.start}): the API takes exec's stdin as a string; "
                "write binary input to a session (exec.start) instead",
                0, {"field": "stdin"},
            ) from None
    elif isinstance(stdin, str):
        text = stdin
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:
            raise StrataError("invalid_argument", "stdin holds characters UTF-8 cannot encode (lone surrogates)", 0, {"field": "stdin"}) from None
    else:
        raise StrataError("invalid_argument", f"stdin is a str or bytes, not {type(stdin).__name__}", 0, {"field": "stdin"})
    if len(raw) > MAX_RUN_STDIN:
        raise StrataError("invalid_argument", f"stdin is {len(raw)} bytes, over the API's 1 MiB", 0, {"field": "stdin", "limit": MAX_RUN_STDIN})
    return text


@dataclass
class ExecResult:
    """The result of ``sb.exec.run``: a non-zero exit is still a result.

    ``stdout``/``stderr`` are text (invalid UTF-8 replaced); the exact bytes
    are ``stdout_bytes``/``stderr_bytes``. ``exit_code`` is 128+N when signal
    N ended the program, -1 with ``timed_out`` when the timeout did.
    ``truncated``: a stream was cut at 1 MiB. ``duration_ms``: how long it ran.
    """

    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    timed_out: bool
    truncated: bool
    duration_ms: int

    @property
    def stdout(self) -> str:
        """Standard output as text (UTF-8, invalid bytes replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """Standard error as text (UTF-8, invalid bytes replaced)."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0


class Output(NamedTuple):
    """One chunk of a session's output: ``stream`` is ``"stdout"`` or
    ``"stderr"`` (with a terminal, everything is ``"stdout"``)."""

    stream: str
    data: bytes


_END = object()


class Session:
    """A running command with its streams (``sb.exec.start`` / ``attach``).

    Iterate it for ``Output`` chunks until the command exits; ``write()``
    its stdin, ``close_stdin()``, ``resize()``, ``signal()``, ``kill()``,
    ``wait()`` for its exit code. One background thread reads the attachment
    (answering pings, attaching again after a snapshot, pause or restore:
    see the module docstring); output waits in a bounded queue (256 chunks),
    so a program whose output is never read is not held up for long (the
    server tells of what it dropped, counted in ``dropped_bytes``).

    Stdin written while detached is queued and sent once attached again.
    Stdin the attachment had already taken when an operation ended it is
    not acknowledged by the protocol: bytes written in the last moments
    before a 1011 close were seen to be lost (the server's side), so an
    interactive program should not rely on keystrokes sent right as a
    snapshot starts.
    ``close()`` ends the attachment only (a session that is not detachable
    then gets SIGHUP); use it as a context manager.
    """

    def __init__(self, sandbox: "Sandbox", record: Record, since: int = 0) -> None:
        self.sandbox = sandbox
        self.info: Record = record
        self.id: str = record["id"]
        self.offset: int = since
        self.dropped_bytes: int = 0
        self.exit_code: int | None = None
        self.reattached: int = 0
        # The run of the guest's memory the offsets are of (None from a
        # server that predates generations: nothing is checked then).
        self.generation: str | None = record.get("generation") or None
        self._lock = threading.Lock()
        self._ws: WebSocket | None = None
        self._pending: list[tuple[int, bytes]] = []  # messages written while detached
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=256)
        self._error: StrataError | None = None
        self._closing = False
        self._done = threading.Event()
        self._ws = self._attach(first=True)
        self._thread = threading.Thread(target=self._run, name=f"strata-session-{self.id}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, sandbox={self.sandbox.id!r}, exit_code={self.exit_code!r})"

    @property
    def attached(self) -> bool:
        """True while an attachment is open (False in the gap after an
        operation ended one, and after the end)."""
        return self._ws is not None and not self._done.is_set()

    # -- attachments ------------------------------------------------------

    def _attach(self, first: bool) -> WebSocket | None:
        """Open an attachment from the offset reached; when not ``first``,
        try again while the sandbox is busy (see the module docstring).
        None when close() was called meanwhile (an attachment opened then
        is closed at once)."""
        client = self.sandbox.client
        path = f"/v1/sandboxes/{quote(self.sandbox.id)}/sessions/{quote(self.id)}/attach"
        deadline = time.monotonic() + REATTACH_FOR
        while True:
            if self._closing and not first:
                return None
            url = client.api_url + path + f"?since={self.offset}"
            if self.generation:
                url += f"&generation={quote(self.generation)}"
            client.notify("GET", path)
            try:
                ws = WebSocket.connect(url, {"X-Api-Key": client.api_key}, [SUBPROTOCOL], timeout=30.0)
            except StrataError as e:
                if e.code == "session_restored":
                    raise StrataError(
                        e.code,
                        f"session {self.id}: the sandbox was restored or forked since this session's "
                        f"attachment began, and the session is another run now, whose output from byte "
                        f"{self.offset} is not what came here; follow that run with sb.exec.attach({self.id!r})",
                        e.status, e.data, e.request_id,
                    ) from None
                if first:
                    raise
                if self._closing:
                    return None
                busy = e.status == 0 or e.status >= 500 or (e.status == 409 and e.code != "sandbox_not_running")
                if e.code == "sandbox_not_running":
                    busy = e.data.get("state") not in ("paused", "stopped", "error")
                if not busy or time.monotonic() > deadline or self._closing:
                    if e.code == "session_not_found":
                        raise StrataError(
                            e.code,
                            "the attachment was ended by an operation on the sandbox, and the session is gone "
                            "(the sandbox was restored to a moment before it, or its guest daemon started again)",
                            e.status, e.data, e.request_id,
                        ) from None
                    raise StrataError(
                        e.code if e.status else "attachment_closed",
                        f"the attachment was ended by an operation on the sandbox and could not be opened again "
                        f"({e.message}); attach later with sb.exec.attach({self.id!r}, since={self.offset})",
                        e.status, e.data, e.request_id,
                    ) from None
                time.sleep(0.25)
                continue
            if self._closing and not first:  # close() came during the gap
                ws.close(CLOSE_NORMAL)
                ws.shutdown()
                return None
            return ws

    def _flush(self, ws: WebSocket) -> bool:
        """Send what was written while detached, then make ws current.
        False (ws closed) when close() was called meanwhile."""
        with self._lock:
            if self._closing:
                ws.close(CLOSE_NORMAL)
                ws.shutdown()
                return False
            pending, self._pending = self._pending, []
            for i, (op, data) in enumerate(pending):
                try:
                    ws.send_binary(data) if op == OP_BINARY else ws.send_text(data.decode())
                except WebSocketClosed:
                    self._pending = pending[i:]  # those not sent: by the next attachment
                    break
            self._ws = ws
            return True

    def _run(self) -> None:
        try:
            while True:
                ws = self._ws
                assert ws is not None
                if self._read_attachment(ws):
                    with self._lock:
                        self._ws = None
                    return
                # Ended by an operation on the sandbox (1011) or broken: attach again.
                with self._lock:
                    self._ws = None
                if self._closing:
                    return
                new = self._attach(first=False)
                if new is None:
                    return
                self.reattached += 1
                if not self._flush(new):
                    return
        except StrataError as e:
            self._error = e
        except Exception as e:  # a bug or an OS failure: do not hang the reader
            self._error = StrataError("attachment_closed", f"session {self.id}: {e!r}")
        finally:
            self._done.set()
            self._queue.put(_END)

    def reattach(self) -> None:
        """Attach again from the offset reached, after the session's
        attachment failed for good (the sandbox was paused or stopped, or
        did not come back within 55 s): e.g. after ``sb.resume()``. Stdin
        written meanwhile is sent first. Does nothing while attached. A
        pause, restore or fork in between makes the session another run:
        StrataError ``session_restored`` (see the module docstring)."""
        if not self._done.is_set():
            return
        if self.exit_code is not None:
            raise StrataError("attachment_closed", f"session {self.id} has exited ({self.exit_code})")
        ws = self._attach(first=True)
        assert ws is not None
        self._error = None
        self._closing = False
        self._queue = queue.Queue(maxsize=256)
        self._done.clear()
        self.reattached += 1
        self._flush(ws)  # _closing is False: ws made current
        self._thread = threading.Thread(target=self._run, name=f"strata-session-{self.id}", daemon=True)
        self._thread.start()

    def _read_attachment(self, ws: WebSocket) -> bool:
        """Copy one attachment's output; True when the session is over (its
        exit, or close()), False to attach again."""
        while True:
            try:
                op, payload = ws.recv()
            except WebSocketClosed as c:
                if self._closing:
                    return True
                if c.code == CLOSE_INTERNAL or c.code == 1006:
                    return False
                if c.code == CLOSE_NORMAL:
                    raise StrataError("attachment_closed", f"session {self.id}: the attachment closed before the command's exit") from None
                raise StrataError("attachment_closed", f"session {self.id}: the attachment was ended ({c.code}): {c.reason}") from None
            if op == OP_BINARY:
                if not payload:
                    continue
                data = payload[1:]
                self.offset += len(data)
                stream = "stderr" if payload[0] == STREAM_STDERR else "stdout"
                self._put(Output(stream, data))
                continue
            try:
                msg = json.loads(payload)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("type") == "dropped":
                n = int(msg.get("bytes") or 0)
                self.offset += n
                self.dropped_bytes += n
            elif msg.get("type") == "exit":
                code = msg.get("exit_code")
                if code is None:
                    try:
                        code = self.sandbox.exec.get(self.id).get("exit_code")
                    except StrataError:
                        code = None
                self.exit_code = int(code) if code is not None else -1
                ws.close(CLOSE_NORMAL)
                try:
                    ws.recv()
                except WebSocketClosed:
                    pass
                ws.shutdown()
                return True

    def _put(self, item: Output) -> None:
        while not self._closing:
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    # -- output -----------------------------------------------------------

    def __iter__(self) -> Iterator[Output]:
        return self

    def __next__(self) -> Output:
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)  # later iterations end too
            if self._error is not None and not self._closing:
                raise self._error
            raise StopIteration
        return item  # type: ignore[no-any-return]

    def next_chunk(self, timeout: float | None = None) -> Output | None:
        """The next output chunk, or None once the session is over (raises
        StrataError if its attachment failed); ``queue.Empty`` after timeout."""
        item = self._queue.get(timeout=timeout)
        if item is _END:
            self._queue.put(_END)
            if self._error is not None and not self._closing:
                raise self._error
            return None
        return item  # type: ignore[no-any-return]

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command's exit and return its code (128+N for
        signal N, -1 when its timeout killed it). Output not yet read is
        read and dropped. StrataError on a failed attachment or after
        ``timeout`` seconds (code ``wait_timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                raise StrataError("wait_timeout", f"session {self.id} still running after {timeout} s") from None
            if item is _END:
                self._queue.put(_END)
                break
        if self._error is not None:
            raise self._error
        if self.exit_code is None:
            raise StrataError("attachment_closed", f"session {self.id}: the attachment was closed before the command's exit")
        return self.exit_code

    def output(self) -> tuple[bytes, bytes]:
        """Read the rest of the output until the exit: (stdout, stderr)."""
        out, err = bytearray(), bytearray()
        for chunk in self:
            (err if chunk.stream == "stderr" else out).extend(chunk.data)
        return bytes(out), bytes(err)

    # -- input and control --------------------------------------------------

    def _send(self, op: int, data: bytes) -> None:
        if self._closing:
            raise StrataError("attachment_closed", f"session {self.id}: the attachment is closed")
        with self._lock:
            ws = self._ws
            if ws is None or self._pending or self._done.is_set():
                self._pending.append((op, data))
                return
            try:
                ws.send_binary(data) if op == OP_BINARY else ws.send_text(data.decode())
            except WebSocketClosed:
                self._pending.append((op, data))  # the reader attaches again and sends it

    def write(self, data: bytes | str) -> None:
        """Send bytes (a str as UTF-8) to the command's stdin."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        for i in range(0, len(data), MAX_STDIN_CHUNK):
            self._send(OP_BINARY, bytes([STREAM_STDIN]) + data[i : i + MAX_STDIN_CHUNK])

    def close_stdin(self) -> None:
        """Close the command's stdin (``{"type":"eof"}``; with a terminal, ^D)."""
        self._send(OP_TEXT, b'{"type":"eof"}')

    def resize(self, rows: int, cols: int) -> None:
        """Resize the session's terminal (tty sessions)."""
        self._send(OP_TEXT, json.dumps({"type": "resize", "rows": rows, "cols": cols}).encode())

    def signal(self, name: str) -> None:
        """Send a signal to the session's process group: ``HUP INT QUIT KILL
        USR1 USR2 TERM CONT STOP TSTP WINCH`` (with or without ``SIG``)."""
        name = name.upper().removeprefix("SIG")
        self._send(OP_TEXT, json.dumps({"type": "signal", "signal": name}).encode())

    def kill(self) -> Record:
        """End the session (``DELETE``): SIGTERM to its processes, SIGKILL
        5 s later. Returns its record."""
        return self.sandbox.exec.kill(self.id)

    def refresh(self) -> Record:
        """Read the session's record again."""
        self.info = self.sandbox.exec.get(self.id)
        return self.info

    def close(self) -> None:
        """End this attachment (the session goes on if it is detachable)."""
        self._closing = True
        with self._lock:
            ws = self._ws
        if ws is not None:
            ws.close(CLOSE_NORMAL)
            ws.shutdown()
        self._done.wait(5)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Exec:
    """``sb.exec``: commands in the sandbox (one-shot and sessions)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _path(self, *rest: str) -> str:
        return f"/v1/sandboxes/{quote(self._sb.id)}" + "".join("/" + quote(r) for r in rest)

    def run(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: int | None = None,
        stdin: str | bytes | None = None,
    ) -> ExecResult:
        """Run a command to its end (``POST …/exec``) and return its result.

        A str runs as ``["sh", "-c", command]``, a list directly. ``cwd``
        (default ``/``), ``env`` (added to the sandbox's), ``timeout_s``
        (default 60, 1–3600: then every process of it is killed),
        ``stdin`` (≤ 1 MiB of UTF-8 text: the API takes it as a JSON
        string, so bytes that are not UTF-8 are StrataError
        ``invalid_argument``; send binary input with a session's
        ``write``, or as base64 to ``base64 -d``). Each stream keeps its
        first 1 MiB. A program that cannot start is StrataError
        ``exec_failed``."""
        body: dict[str, Any] = {"cmd": argv(command), "encoding": "base64"}
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if stdin is not None:
            body["stdin"] = _stdin_text(stdin)
        wait = (timeout_s or 60) + 40
        d = self._sb.client.request("POST", self._path("exec"), body=body, timeout=wait).data
        return ExecResult(
            exit_code=int(d.get("exit_code", -1)),
            stdout_bytes=base64.b64decode(d.get("stdout") or ""),
            stderr_bytes=base64.b64decode(d.get("stderr") or ""),
            timed_out=bool(d.get("timed_out")),
            truncated=bool(d.get("truncated")),
            duration_ms=int(d.get("duration_ms") or 0),
        )

    def start(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        tty: bool = False,
        rows: int | None = None,
        cols: int | None = None,
        detachable: bool = False,
        timeout_s: int | None = None,
    ) -> Session:
        """Start a command as a session (``POST …/sessions``) and attach to
        it from its first byte of output. ``tty`` gives it a terminal of
        ``rows`` × ``cols`` (24 × 80); a ``detachable`` session outlives its
        attachments (else it gets SIGHUP when the last one closes);
        ``timeout_s`` (1–3600, none by default) kills it."""
        body: dict[str, Any] = {"cmd": argv(command)}
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if tty:
            body["tty"] = True
        if rows is not None:
            body["rows"] = rows
        if cols is not None:
            body["cols"] = cols
        if detachable:
            body["detachable"] = True
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        record = self._sb.client.request("POST", self._path("sessions"), body=body).data
        return Session(self._sb, record, since=0)

    def attach(self, session_id: str, *, since: int = 0) -> Session:
        """Attach to a running (or recently exited) session from output
        offset ``since`` (default 0: everything the session still holds;
        output no longer held is counted in ``dropped_bytes``)."""
        record = self.get(session_id)
        return Session(self._sb, record, since=since)

    def list(self) -> list[Record]:
        """The sandbox's sessions, oldest first (exited ones for 10 minutes)."""
        data = self._sb.client.request("GET", self._path("sessions")).data
        return list(data.get("sessions") or []) if isinstance(data, dict) else list(data or [])

    def get(self, session_id: str) -> Record:
        """One session's record (``state``, ``exit_code``, ``output_bytes`` …)."""
        return self._sb.client.request("GET", self._path("sessions", session_id)).data  # type: ignore[no-any-return]

    def kill(self, session_id: str) -> Record:
        """End a session (``DELETE``): SIGTERM, SIGKILL 5 s later; its record."""
        return self._sb.client.request("DELETE", self._path("sessions", session_id)).data  # type: ignore[no-any-return]
