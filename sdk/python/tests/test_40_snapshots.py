"""VM snapshots (the seeds' checkpoints) and forks."""

from __future__ import annotations

import time

import pytest

from strata import Sandbox, StrataError


def delete_when_ready(sb: Sandbox, id: str) -> None:
    """An automatic snapshot is processing while its memory is written: 409 operation_in_progress."""
    deadline = time.monotonic() + 120
    while sb.snapshots.get(id).status == "processing" and time.monotonic() < deadline:
        time.sleep(0.5)
    sb.snapshots.delete(id)


def test_snapshots(sb: Sandbox, name: str) -> None:
    sb.exec.run("echo before > /root/snapfile")
    s = sb.snapshots.create(name=name, comment="sdk test")
    try:
        assert s.status == "ready" and s.memory is True and s.sandbox == sb.id
        assert s.get("name") == name
        assert sb.snapshots.get(s.id).id == s.id
        assert sb.snapshots.get(name).id == s.id  # a name wherever an id goes
        assert s.id in [x.id for x in sb.snapshots.list()]
        assert sb.snapshots.pin(s.id).pinned is True
        assert sb.snapshots.unpin(s.id).pinned is False
        with pytest.raises(StrataError) as e:
            sb.snapshots.create(name=name)
        assert e.value.status == 409 and e.value.code == "name_taken"

        sb.exec.run("echo after > /root/snapfile")
        r = sb.snapshots.restore(s.id)
        assert r.snapshot_id == s.id and r.state == "running" and r.auto_id
        assert sb.info.state == "running"
        assert sb.exec.run("cat /root/snapfile").stdout == "before\n"
        delete_when_ready(sb, r.auto_id)
    finally:
        sb.snapshots.delete(s.id)
    with pytest.raises(StrataError) as e:
        sb.snapshots.get(s.id)
    assert e.value.status == 404 and e.value.code == "snapshot_not_found"


def test_seed_aliases_and_forks(sb: Sandbox, name: str) -> None:
    """The seeds' calls speak OpenComputer's CheckpointInfo (``id`` the
    snapshot's ref): a fork of it needs no sandbox; forks take their own env
    and labels, are found by them and by their names."""
    sb.exec.run("echo forked > /root/forkfile")
    # The source's network, which a fork without one keeps.
    n = sb.network.set("list", allow=["PyPI.org.", "*.github.com"])
    assert n["egress"] == "list" and n["allow"] == ["pypi.org", "*.github.com"]  # the canonical form
    assert n["usage"]["refused"] >= 0 and sb.network.get()["egress"] == "list"
    with pytest.raises(StrataError) as bad:
        sb.network.set("all", allow=["pypi.org"])
    assert bad.value.status == 400 and bad.value.code == "invalid_field"
    cp = sb.create_checkpoint(f"{name}-after-build", kind="disk_only")
    try:
        assert cp["id"].startswith("sn-") and cp["sandboxId"] == sb.id and cp["status"] == "ready" and cp["kind"] == "disk_only"
        assert cp["id"] in [c["id"] for c in sb.list_checkpoints()]
        assert sb.snapshots.get(cp["id"]).id == cp["snapshotId"]  # a ref wherever an id goes
        fork = Sandbox.create_from_checkpoint(cp["id"], name=f"{name}-one", env={"SEED": "loam"}, labels={"owner": name}, client=sb.client, timeout=600)
        try:
            assert fork.info.state == "running" and fork.info["from"] == {"sandbox": sb.id, "snapshot": cp["snapshotId"]}
            assert fork.exec.run("cat /root/forkfile").stdout == "forked\n"
            assert fork.network.get()["egress"] == "list"  # its source's
            # The fork's env under the call's own; by its name wherever its id goes.
            byname = Sandbox.connect(f"{name}-one", client=sb.client)
            assert byname.exec.run("echo $SEED $X", env={"X": "call"}).stdout == "loam call\n"
            assert byname.exec.run("echo $SEED", env={"SEED": "mine"}).stdout == "mine\n"
            assert [f.id for f in Sandbox.list(labels={"owner": name}, client=sb.client)] == [fork.id]
            assert byname.set_labels({"owner": name, "tier": "a"})["labels"] == {"owner": name, "tier": "a"}
            assert Sandbox.list(labels={"owner": name, "tier": "b"}, client=sb.client) == []
            assert fork.refresh()["env"] == {"SEED": "loam"}
        finally:
            fork.kill()
        forks = sb.fork(f"{name}-after-build", name=name, count=1, network={"egress": "none"})
        try:
            assert len(forks) == 1 and not forks.failed
            assert forks[0].network.get()["egress"] == "none"  # its own
            assert forks[0].info.name == f"{name}-1" and forks[0].info.state == "running"
            assert forks[0].exec.run("cat /root/forkfile").stdout == "forked\n"
        finally:
            for f in forks:
                f.kill()
        one = sb.fork(cp["id"], name=f"{name}-two", labels={"owner": "docs"})  # loam's fork(id, {name, labels})
        try:
            assert one.info.name == f"{name}-two" and one.info["labels"] == {"owner": "docs"}
        finally:
            one.kill()
        with pytest.raises(StrataError) as e:
            Sandbox.connect(f"{name}-two", client=sb.client).refresh()
        assert e.value.code == "sandbox_not_found"  # a deleted sandbox's name is free, and unknown
        sb.exec.run("echo changed > /root/forkfile")
        sb.restore_checkpoint(cp["id"])  # disk-only: a fresh boot of its disk
        assert sb.exec.run("cat /root/forkfile").stdout == "forked\n"
        for auto in [x for x in sb.snapshots.list() if x.auto]:
            delete_when_ready(sb, auto.id)
    finally:
        sb.delete_checkpoint(cp["id"])
        sb.network.set("all")
