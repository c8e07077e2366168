"""The asyncio client: ``AsyncSandbox``, the same API as ``Sandbox``, awaitable.

How: each call runs the synchronous client in a worker thread
(``asyncio.to_thread``, the loop's default executor), so the event loop
never blocks on the network and the two clients cannot drift apart; many
calls may be awaited at once (``asyncio.gather``). Such a call ends by
itself (each request has its timeout).

Sessions are async iterators (``async for chunk in session``) and take no
worker of the executor while they wait: each AsyncSession has a reader
thread of its own that moves the session's output into an ``asyncio.Queue``
(``loop.call_soon_threadsafe``), at most 64 chunks ahead of the reader
(the thread waits when the queue is full: nothing is dropped). Awaiting
``__anext__``, ``wait()`` or ``output()`` only awaits that queue, so
cancelling one (``asyncio.wait_for`` with a timeout) loses no output: the
next ``__anext__`` gets the chunk it would have got. Waiting sessions do
not hold up the other calls of an AsyncSandbox.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, ParamSpec, TypeVar, BinaryIO

from ._client import Strata, resolve
from ._errors import StrataError
from ._records import Record
from .checkpoints import Checkpoints, Retention
from .exec import Command, Exec, ExecResult, Output, Session
from .files import Files, FileStream
from .network import Network
from .sandbox import ForkList, Sandbox, WAIT_TIMEOUT
from .snapshots import Snapshots
from .tokens import AccessToken

P = ParamSpec("P")
R = TypeVar("R")


def _threaded(fn: Callable[..., R]) -> Callable[..., Awaitable[R]]:
    """An async method that runs the sync method fn of self._sync in a thread."""

    @functools.wraps(fn)
    async def method(self: Any, *args: Any, **kwargs: Any) -> R:
        return await asyncio.to_thread(fn, self._sync, *args, **kwargs)

    return method


ASYNC_QUEUE = 64  # chunks an AsyncSession's reader thread may be ahead


class _End:
    """The end of one reader's output (``gen``: which reader), with the
    attachment's failure if any."""

    def __init__(self, gen: int, error: StrataError | None) -> None:
        self.gen = gen
        self.error = error


class AsyncSession:
    """A session (see ``Session``) for asyncio: ``async for chunk in
    session`` yields ``Output(stream, data)``; the other methods are
    awaitable. Its output comes through a reader thread of its own into an
    ``asyncio.Queue`` (see the module docstring): cancelling a pending
    ``__anext__``, ``wait()`` or ``output()`` loses nothing."""

    def __init__(self, sync: Session) -> None:
        self._sync = sync
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: "asyncio.Queue[Output | _End] | None" = None
        self._slots = threading.Semaphore(ASYNC_QUEUE)
        self._stop = threading.Event()
        self._gen = 0
        self._end: _End | None = None
        self._reader: threading.Thread | None = None

    @property
    def id(self) -> str:
        """The session's id (``se-…``)."""
        return self._sync.id

    @property
    def exit_code(self) -> int | None:
        """The exit code once known."""
        return self._sync.exit_code

    @property
    def offset(self) -> int:
        """The output offset reached (bytes received plus bytes dropped)."""
        return self._sync.offset

    @property
    def generation(self) -> str | None:
        """The guest's generation the attachments name (see ``Session``)."""
        return self._sync.generation

    @property
    def info(self) -> Record:
        """The session's record as last read."""
        return self._sync.info

    @property
    def attached(self) -> bool:
        """True while an attachment is open."""
        return self._sync.attached

    @property
    def sync(self) -> Session:
        """The synchronous Session underneath (do not iterate both)."""
        return self._sync

    def __repr__(self) -> str:
        return f"Async{self._sync!r}"

    # -- the reader thread ------------------------------------------------

    def _ensure_reader(self) -> "asyncio.Queue[Output | _End]":
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop:
            if self._reader is not None and self._reader.is_alive():
                raise StrataError("invalid_argument", f"session {self.id} is read by another event loop")
            # A first read, or a new loop (asyncio.run again): what the old
            # loop's queue held is gone with it.
            self._loop = loop
            self._queue = asyncio.Queue()
            self._reader = None
            self._slots = threading.Semaphore(ASYNC_QUEUE)
        if self._reader is None and self._end is None:
            self._reader = threading.Thread(
                target=self._read, args=(loop, self._queue, self._gen), name=f"strata-async-{self.id}", daemon=True
            )
            self._reader.start()
        return self._queue

    def _read(self, loop: asyncio.AbstractEventLoop, q: "asyncio.Queue[Output | _End]", gen: int) -> None:
        """The reader thread: the sync session's chunks into q, in order,
        waiting for room (at most ASYNC_QUEUE ahead), then its end."""
        error: StrataError | None = None
        try:
            while not self._stop.is_set():
                try:
                    chunk = self._sync.next_chunk()
                except StrataError as e:
                    error = e
                    break
                if chunk is None:
                    break
                while not self._slots.acquire(timeout=0.5):  # back-pressure: wait for room
                    if self._stop.is_set() or loop.is_closed():
                        break
                else:
                    loop.call_soon_threadsafe(q.put_nowait, chunk)
        except RuntimeError:  # the loop was closed: nobody reads any more
            return
        except Exception as e:  # a bug: do not leave the reader hanging
            error = StrataError("attachment_closed", f"session {self.id}: {e!r}")
        try:
            loop.call_soon_threadsafe(q.put_nowait, _End(gen, error))
        except RuntimeError:
            pass

    async def _next(self) -> Output | None:
        """The next chunk, or None at the end (raises the attachment's failure)."""
        while self._end is None:
            q = self._ensure_reader()
            item = await q.get()  # cancel-safe: an item is taken only when returned
            if isinstance(item, _End):
                self._reader = None  # that reader has ended
                if item.gen != self._gen:
                    continue  # the end of a reader from before reattach(): a new one goes on
                self._end = item
                break
            self._slots.release()
            return item
        if self._end.error is not None and not self._sync._closing:
            raise self._end.error
        return None

    def __aiter__(self) -> AsyncIterator[Output]:
        return self

    async def __anext__(self) -> Output:
        chunk = await self._next()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def wait(self, timeout: float | None = None) -> int:
        """Wait for the command's exit and return its code (see
        ``Session.wait``): output not yet read is read and dropped;
        StrataError ``wait_timeout`` after ``timeout`` seconds (the session
        goes on and may be waited for again), or the attachment's failure."""

        async def drain() -> None:
            while await self._next() is not None:
                pass

        if timeout is None:
            await drain()
        else:
            try:
                await asyncio.wait_for(drain(), timeout)
            except asyncio.TimeoutError:
                raise StrataError("wait_timeout", f"session {self.id} still running after {timeout} s") from None
        if self._sync.exit_code is None:
            raise StrataError("attachment_closed", f"session {self.id}: the attachment was closed before the command's exit")
        return self._sync.exit_code

    async def output(self) -> tuple[bytes, bytes]:
        """Read the rest of the output until the exit: (stdout, stderr)."""
        out, err = bytearray(), bytearray()
        async for chunk in self:
            (err if chunk.stream == "stderr" else out).extend(chunk.data)
        return bytes(out), bytes(err)

    async def reattach(self) -> None:
        """Attach again from the offset reached, after the attachment failed
        for good (see ``Session.reattach``); output then goes on."""
        before = self._sync.reattached
        await asyncio.to_thread(self._sync.reattach)
        if self._sync.reattached != before:
            # The end the reader reports (or reported) is no longer the end:
            # it is skipped, and a reader of this generation takes over.
            self._gen += 1
            self._end = None
            self._stop.clear()

    async def close(self) -> None:
        """End this attachment (the session goes on if it is detachable);
        the reader thread ends too."""
        try:
            await asyncio.to_thread(self._sync.close)
        finally:
            self._stop.set()

    write = _threaded(Session.write)
    close_stdin = _threaded(Session.close_stdin)
    resize = _threaded(Session.resize)
    signal = _threaded(Session.signal)
    kill = _threaded(Session.kill)
    refresh = _threaded(Session.refresh)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncExec:
    """``sb.exec`` of an AsyncSandbox (see ``Exec``)."""

    def __init__(self, sync: Exec) -> None:
        self._sync = sync

    run = _threaded(Exec.run)
    list = _threaded(Exec.list)
    get = _threaded(Exec.get)
    kill = _threaded(Exec.kill)

    async def start(self, command: Command, **kwargs: Any) -> AsyncSession:
        """Start a command as a session (see ``Exec.start``)."""
        return AsyncSession(await asyncio.to_thread(self._sync.start, command, **kwargs))

    async def attach(self, session_id: str, *, since: int = 0) -> AsyncSession:
        """Attach to a session from output offset ``since`` (see ``Exec.attach``)."""
        return AsyncSession(await asyncio.to_thread(self._sync.attach, session_id, since=since))


class AsyncFiles:
    """``sb.files`` of an AsyncSandbox (see ``Files``). ``read_stream``
    returns an async iterator of chunks."""

    def __init__(self, sync: Files) -> None:
        self._sync = sync

    write = _threaded(Files.write)
    write_stream = _threaded(Files.write_stream)
    read = _threaded(Files.read)
    read_text = _threaded(Files.read_text)
    list = _threaded(Files.list)
    stat = _threaded(Files.stat)
    exists = _threaded(Files.exists)
    remove = _threaded(Files.remove)
    upload = _threaded(Files.upload)
    download = _threaded(Files.download)

    async def read_stream(self, path: str, **kwargs: Any) -> AsyncIterator[bytes]:
        """A file's bytes as an async iterator of chunks (see ``Files.read_stream``)."""
        f: FileStream = await asyncio.to_thread(self._sync.read_stream, path, **kwargs)
        try:
            while True:
                chunk = await asyncio.to_thread(f.read, 64 * 1024)
                if not chunk:
                    return
                yield chunk
        finally:
            f.close()


class AsyncCheckpoints:
    """``sb.checkpoints`` of an AsyncSandbox: directory checkpoints (see ``Checkpoints``)."""

    def __init__(self, sync: Checkpoints) -> None:
        self._sync = sync

    create = _threaded(Checkpoints.create)
    list = _threaded(Checkpoints.list)
    restore = _threaded(Checkpoints.restore)
    delete = _threaded(Checkpoints.delete)
    changes = _threaded(Checkpoints.changes)
    stat_file = _threaded(Checkpoints.stat_file)
    read_file = _threaded(Checkpoints.read_file)
    list_files = _threaded(Checkpoints.list_files)
    restore_paths = _threaded(Checkpoints.restore_paths)
    clone = _threaded(Checkpoints.clone)
    directories = _threaded(Checkpoints.directories)
    release = _threaded(Checkpoints.release)


class AsyncSnapshots:
    """``sb.snapshots`` of an AsyncSandbox: VM snapshots (see ``Snapshots``)."""

    def __init__(self, sync: Snapshots) -> None:
        self._sync = sync

    create = _threaded(Snapshots.create)
    list = _threaded(Snapshots.list)
    get = _threaded(Snapshots.get)
    restore = _threaded(Snapshots.restore)
    delete = _threaded(Snapshots.delete)
    pin = _threaded(Snapshots.pin)
    unpin = _threaded(Snapshots.unpin)


class AsyncAccessToken:
    """``sb.access_token`` of an AsyncSandbox (see ``AccessToken``)."""

    def __init__(self, sync: AccessToken) -> None:
        self._sync = sync

    issue = _threaded(AccessToken.issue)
    get = _threaded(AccessToken.get)
    rotate = _threaded(AccessToken.rotate)
    revoke = _threaded(AccessToken.revoke)


class AsyncNetwork:
    """``sb.network`` of an AsyncSandbox (see ``Network``)."""

    def __init__(self, sync: Network) -> None:
        self._sync = sync

    get = _threaded(Network.get)
    set = _threaded(Network.set)


class AsyncSandbox:
    """A sandbox for asyncio: the API of ``Sandbox``, every call awaitable
    (run in a worker thread with ``asyncio.to_thread``; see the module
    docstring). ``await AsyncSandbox.create()``, ``AsyncSandbox.connect(id)``
    (no call, so not awaited), ``await AsyncSandbox.list()``."""

    def __init__(self, sync: Sandbox) -> None:
        self._sync = sync
        self.exec = AsyncExec(sync.exec)
        self.files = AsyncFiles(sync.files)
        self.checkpoints = AsyncCheckpoints(sync.checkpoints)
        self.snapshots = AsyncSnapshots(sync.snapshots)
        self.access_token = AsyncAccessToken(sync.access_token)
        self.network = AsyncNetwork(sync.network)

    def __repr__(self) -> str:
        return f"Async{self._sync!r}"

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return self._sync.id

    @property
    def client(self) -> Strata:
        """The configured client."""
        return self._sync.client

    @property
    def sync(self) -> Sandbox:
        """The synchronous Sandbox underneath."""
        return self._sync

    @property
    def info(self) -> Record | None:
        """The record as last read (None when never read: ``await refresh()``)."""
        return self._sync._info

    @classmethod
    async def create(cls, **kwargs: Any) -> "AsyncSandbox":
        """Create a sandbox and return it once running (see ``Sandbox.create``)."""
        return cls(await asyncio.to_thread(functools.partial(Sandbox.create, **kwargs)))

    @classmethod
    async def create_from_checkpoint(cls, snapshot_id: "str | dict[str, Any]", **kwargs: Any) -> "AsyncSandbox":
        """Fork a VM snapshot (see ``Sandbox.create_from_checkpoint``)."""
        return cls(await asyncio.to_thread(functools.partial(Sandbox.create_from_checkpoint, snapshot_id, **kwargs)))

    @classmethod
    def connect(cls, id: str | None = None, *, client: Strata | None = None) -> "AsyncSandbox":
        """The sandbox ``id`` or name (or the configured one); makes no
        call, so a name stays ``.id`` as given (every route takes it;
        ``await refresh()`` reads the record). ``Sandbox.connect`` reads a
        name's record."""
        c = resolve(client)
        sid = id or c.sandbox_id
        if not sid:
            raise StrataError("invalid_argument", "no sandbox id: pass one, or set CREATEOS_SANDBOX_ID")
        return cls(Sandbox(sid, client=c))

    @classmethod
    async def list(cls, *, labels: dict[str, str] | None = None, client: Strata | None = None) -> list["AsyncSandbox"]:
        """Every sandbox of the account; with ``labels``, those that have every one of them."""
        return [cls(s) for s in await asyncio.to_thread(functools.partial(Sandbox.list, labels=labels, client=client))]

    refresh = _threaded(Sandbox.refresh)
    wait_until = _threaded(Sandbox.wait_until)
    kill = _threaded(Sandbox.kill)
    set_access = _threaded(Sandbox.set_access)
    set_labels = _threaded(Sandbox.set_labels)
    pause = _threaded(Sandbox.pause)
    resume = _threaded(Sandbox.resume)
    stop = _threaded(Sandbox.stop)
    start = _threaded(Sandbox.start)
    create_checkpoint = _threaded(Sandbox.create_checkpoint)
    list_checkpoints = _threaded(Sandbox.list_checkpoints)
    restore_checkpoint = _threaded(Sandbox.restore_checkpoint)
    delete_checkpoint = _threaded(Sandbox.delete_checkpoint)

    async def fork(self, snapshot: str, **kwargs: Any) -> "AsyncSandbox | list[AsyncSandbox]":
        """Fork a VM snapshot of this sandbox (see ``Sandbox.fork``): an
        AsyncSandbox, or a list when ``count`` is given (``.failed`` as ForkList's)."""
        out = await asyncio.to_thread(functools.partial(self._sync.fork, snapshot, **kwargs))
        if isinstance(out, ForkList):
            forks = _AsyncForkList([AsyncSandbox(s) for s in out], out.failed)
            return forks
        return AsyncSandbox(out)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self._sync.__exit__)


class _AsyncForkList(list[AsyncSandbox]):
    """The AsyncSandboxes of a fork with ``count``; ``failed`` as ForkList's."""

    def __init__(self, items: list[AsyncSandbox], failed: list[Record]) -> None:
        super().__init__(items)
        self.failed = failed
