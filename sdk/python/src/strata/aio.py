"""The asyncio client: ``AsyncSandbox``, the same API as ``Sandbox``, awaitable.

How: each call runs the synchronous client in a worker thread
(``asyncio.to_thread``), so the event loop never blocks on the network and
the two clients cannot drift apart; many calls may be awaited at once
(``asyncio.gather``), each in its own thread. Sessions are async iterators
(``async for chunk in session``) over the same background reader.
"""

from __future__ import annotations

import asyncio
import functools
import os
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, ParamSpec, TypeVar, BinaryIO

from ._client import Strata
from ._records import Record
from .checkpoints import Checkpoints, Retention
from .exec import Command, Exec, ExecResult, Output, Session
from .files import Files, FileStream
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


class AsyncSession:
    """A session (see ``Session``) for asyncio: ``async for chunk in
    session`` yields ``Output(stream, data)``; the other methods are
    awaitable."""

    def __init__(self, sync: Session) -> None:
        self._sync = sync

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
    def info(self) -> Record:
        """The session's record as last read."""
        return self._sync.info

    @property
    def attached(self) -> bool:
        """True while an attachment is open."""
        return self._sync.attached

    def __repr__(self) -> str:
        return f"Async{self._sync!r}"

    def __aiter__(self) -> AsyncIterator[Output]:
        return self

    async def __anext__(self) -> Output:
        chunk = await asyncio.to_thread(self._sync.next_chunk)
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    write = _threaded(Session.write)
    close_stdin = _threaded(Session.close_stdin)
    resize = _threaded(Session.resize)
    signal = _threaded(Session.signal)
    kill = _threaded(Session.kill)
    refresh = _threaded(Session.refresh)
    wait = _threaded(Session.wait)
    output = _threaded(Session.output)
    close = _threaded(Session.close)
    reattach = _threaded(Session.reattach)

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
    async def create_from_checkpoint(cls, snapshot_id: str, **kwargs: Any) -> "AsyncSandbox":
        """Fork a VM snapshot (see ``Sandbox.create_from_checkpoint``)."""
        return cls(await asyncio.to_thread(functools.partial(Sandbox.create_from_checkpoint, snapshot_id, **kwargs)))

    @classmethod
    def connect(cls, id: str | None = None, *, client: Strata | None = None) -> "AsyncSandbox":
        """The sandbox ``id`` (or the configured one); makes no call."""
        return cls(Sandbox.connect(id, client=client))

    @classmethod
    async def list(cls, *, client: Strata | None = None) -> list["AsyncSandbox"]:
        """Every sandbox of the account."""
        return [cls(s) for s in await asyncio.to_thread(functools.partial(Sandbox.list, client=client))]

    refresh = _threaded(Sandbox.refresh)
    wait_until = _threaded(Sandbox.wait_until)
    kill = _threaded(Sandbox.kill)
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
