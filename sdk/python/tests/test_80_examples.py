"""The seeds' examples (examples/*.py), each run as written against the
stack, then checked through what its main() returns; every sandbox it
made is killed after it, passed or failed. They use the configured
default client (CREATEOS_API_URL, CREATEOS_API_KEY), as a program would."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any, Callable

import pytest

from strata import AsyncSandbox, Sandbox, StrataError, configure


@pytest.fixture()
def run(client) -> Callable[..., None]:
    """run(module, check, setup=None): setup, the example's main() (awaited
    when async), check on what it returned; what was made is killed
    afterwards."""
    configure(client.api_url, client.api_key, retry_for=180.0)

    def go(module: str, check: Callable[[dict[str, Any]], None], setup: Callable[[], Any] | None = None) -> None:
        before = {s.id for s in Sandbox.list(client=client)}
        try:
            if setup is not None:
                setup()
            out = importlib.import_module(module).main()
            check(asyncio.run(out) if asyncio.iscoroutine(out) else out)
        finally:
            for s in Sandbox.list(client=client):
                if s.id not in before:
                    try:
                        s.kill()
                    except StrataError:
                        pass

    return go


def sync(sb: Sandbox | AsyncSandbox) -> Sandbox:
    return sb.sync if isinstance(sb, AsyncSandbox) else sb


@pytest.mark.parametrize("module", ["opencomputer_checkpoints", "opencomputer_checkpoints_async"])
def test_opencomputer_checkpoints(run, module: str) -> None:
    run(module, check_checkpoints)


def check_checkpoints(m: dict[str, Any]) -> None:
    sandbox, cp, a, b = sync(m["sandbox"]), m["cp"], sync(m["a"]), sync(m["b"])
    assert cp["id"].startswith("sn-") and cp["sandboxId"] == sandbox.id and cp["status"] == "ready"
    assert cp["name"] == "after-build" and cp["kind"] == "full"
    assert a.id != b.id
    for f in (a, b):
        assert f.info["from"] == {"sandbox": sandbox.id, "snapshot": cp["snapshotId"]}
        assert f.exec.run("cat /app/dist/app.txt").stdout == "built\n"  # each fork has the build
    assert a.exec.run("sh test.sh unit", cwd="/app").stdout == "unit tests pass\n"


@pytest.mark.parametrize("module", ["opencomputer_reference", "opencomputer_reference_async"])
def test_opencomputer_reference(run, module: str) -> None:
    run(module, check_reference)


def check_reference(m: dict[str, Any]) -> None:
    sandbox, first, checkpoint, checkpoints, forked = sync(m["sandbox"]), m["first"], m["checkpoint"], m["checkpoints"], sync(m["forked"])
    assert (first["name"], first["status"], first["kind"]) == ("before-migration", "ready", "full")
    assert (checkpoint["name"], checkpoint["kind"]) == ("autosave", "disk_only")
    assert [(c["name"], c["kind"]) for c in checkpoints] == [("before-migration", "full"), ("autosave", "disk_only")]
    assert forked.info.state == "running" and forked.info["from"] == {"sandbox": sandbox.id, "snapshot": first["snapshotId"]}
    left = sandbox.list_checkpoints()
    assert first["id"] not in [c["id"] for c in left] and "autosave" in [c["name"] for c in left]


def test_opencomputer_parallel_exploration(run) -> None:
    def check(m: dict[str, Any]) -> None:
        assert m["results"] == [
            {"strategy": "--strategy=ours", "exit_code": 0},
            {"strategy": "--strategy=theirs", "exit_code": 1},
            {"strategy": "--strategy=recursive", "exit_code": 0},
        ]

    run("opencomputer_parallel_exploration", check)


def test_loam(run, client) -> None:
    def check(m: dict[str, Any]) -> None:
        box, cp, fork = m["box"], m["cp"], m["fork"]
        assert box.info["name"] == "scratch"
        assert (cp["comment"], cp["kind"]) == ("before upgrade", "full")
        assert (fork.info["name"], fork.info.state, fork.info["labels"]) == ("scratch-2", "running", {"owner": "docs"})
        assert [s.id for s in Sandbox.list(labels={"owner": "docs"}, client=client)] == [fork.id]
        assert cp["id"] not in [c["id"] for c in box.list_checkpoints()]

    run("loam", check, setup=lambda: Sandbox.create(name="scratch", client=client))  # the page's `loam sandbox create scratch`
