"""The asyncio client: the same API, awaitable; sessions as async iterators."""

from __future__ import annotations

import asyncio

from strata import AsyncSandbox, Sandbox


def test_async_client(sb: Sandbox) -> None:
    async def main() -> None:
        a = AsyncSandbox.connect(sb.id, client=sb.client)
        rec = await a.refresh()
        assert rec.state == "running"
        results = await asyncio.gather(*(a.exec.run(f"echo {i}") for i in range(5)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(5)]
        await a.files.write("/tmp/async.txt", b"abc" * 100_000)
        chunks = [c async for c in a.files.read_stream("/tmp/async.txt")]
        assert b"".join(chunks) == b"abc" * 100_000
        assert (await a.files.stat("/tmp/async.txt")).size == 300_000
        await a.files.remove("/tmp/async.txt")
        s = await a.exec.start("echo one; read x; echo got-$x >&2")
        await s.write("two\n")
        seen = [(c.stream, c.data) async for c in s]
        assert b"".join(d for st, d in seen if st == "stdout") == b"one\n"
        assert b"".join(d for st, d in seen if st == "stderr") == b"got-two\n"
        assert await s.wait() == 0
        assert isinstance(await a.checkpoints.list(), list)
        assert isinstance(await a.snapshots.list(), list)
        assert isinstance(await a.exec.list(), list)
        assert (await a.access_token.get()).enabled in (True, False)
        assert sb.id in [x.id for x in await AsyncSandbox.list(client=sb.client)]

    asyncio.run(main())
