"""The asyncio client: the same API, awaitable; sessions as async iterators."""

from __future__ import annotations

import asyncio

from strata import AsyncSandbox, Sandbox, StrataError


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
        await a.access_token.revoke()
        assert (await a.access_token.get()).enabled is False
        t = await a.access_token.issue()
        try:
            assert (await a.access_token.get()).enabled is True
            assert (await a.access_token.get()).hint == t.hint
        finally:
            await a.access_token.revoke()
        assert (await a.access_token.get()).enabled is False
        assert sb.id in [x.id for x in await AsyncSandbox.list(client=sb.client)]

    asyncio.run(main())


def test_async_cancelled_anext_loses_nothing(sb: Sandbox) -> None:
    """A pending __anext__ cancelled by asyncio.wait_for loses no output:
    the next one gets the chunk it would have got, in order. And waiting
    sessions hold no executor worker: other calls go on meanwhile."""

    async def main() -> None:
        a = AsyncSandbox.connect(sb.id, client=sb.client)
        s = await a.exec.start("sleep 1; for i in $(seq 1 40); do echo line-$i; sleep 0.02; done")
        try:
            cancelled = 0
            got = b""
            for _ in range(8):
                try:
                    chunk = await asyncio.wait_for(s.__anext__(), 0.01)
                    got += chunk.data
                except asyncio.TimeoutError:
                    cancelled += 1
            assert cancelled >= 3, "the command sleeps first: most of these should time out"
            # Sessions waiting at once do not stall the other calls.
            idle = [await a.exec.start("sleep 30") for _ in range(8)]  # more than the executor's workers (6 on 2 cores)
            try:
                waits = [asyncio.ensure_future(x.wait()) for x in idle]
                await asyncio.sleep(0.2)
                r = await asyncio.wait_for(a.exec.run("echo still-served"), 60)
                assert r.stdout == "still-served\n"
                for w in waits:
                    assert not w.done()
                    w.cancel()
            finally:
                for x in idle:
                    await x.kill()
                    await x.close()
            async for chunk in s:
                got += chunk.data
            assert got == b"".join(f"line-{i}\n".encode() for i in range(1, 41))
            with_timeout = await a.exec.start("sleep 5")
            try:
                await with_timeout.wait(timeout=0.2)
                raise AssertionError("wait(timeout=0.2) should have run out")
            except StrataError as e:
                assert e.code == "wait_timeout"
            assert await with_timeout.wait() == 0
            assert await s.wait() == 0
        finally:
            await s.close()

    asyncio.run(main())
