"""Directory checkpoints: the four operations and the routes beyond the document."""

from __future__ import annotations

import pytest

from strata import Sandbox, StrataError


def test_directory_checkpoints(sb: Sandbox, name: str) -> None:
    d = f"/workspace/{name}"
    clone = f"/workspace/{name}-clone"
    sb.exec.run(f"mkdir -p {d}/src && echo one > {d}/README.md && echo util > {d}/src/util.go")
    a = sb.checkpoints.create(path=d, name=f"{name}-A")
    assert a.id.startswith("cp_") and a.path == d and "parent_id" not in a
    sb.exec.run(f"echo two > {d}/README.md && echo new > {d}/new.txt && rm {d}/src/util.go")
    b = sb.checkpoints.create(d, name=f"{name}-B", retention=100)
    assert b.parent_id == a.id
    try:
        assert [c.id for c in sb.checkpoints.list(path=d)] == [a.id, b.id]
        assert {c.id for c in sb.checkpoints.list()} >= {a.id, b.id}

        changes = {(c.path, c.change) for c in sb.checkpoints.changes(b.id)}
        assert changes == {("README.md", "modified"), ("new.txt", "added"), ("src/util.go", "deleted")}
        sb.exec.run(f"echo three > {d}/live.txt")
        assert [c.path for c in sb.checkpoints.changes(b.id, against="live")] == ["live.txt"]
        assert {c.path for c in sb.checkpoints.changes(b.id, against=a.id)} == {"README.md", "new.txt", "src/util.go"}

        assert sb.checkpoints.read_file(a.id, "README.md") == b"one\n"
        assert sb.checkpoints.read_file(f"{name}-B", "README.md") == b"two\n"  # by name
        assert {e.name for e in sb.checkpoints.list_files(a.id)} == {"README.md", "src"}
        assert [e.name for e in sb.checkpoints.list_files(a.id, "src")] == ["util.go"]
        with pytest.raises(StrataError) as e:
            sb.checkpoints.read_file(a.id, "nope")
        assert e.value.code == "entry_not_found"

        r = sb.checkpoints.restore_paths(a.id, ["README.md"])
        assert r.paths == ["README.md"]
        assert sb.files.read_text(f"{d}/README.md") == "one\n" and sb.files.exists(f"{d}/new.txt")

        r = sb.checkpoints.restore(a.id)
        assert r.checkpoint_id == a.id and r.path == d
        assert r.get("safety_checkpoint_id", "").startswith("cp_")  # live.txt was unsaved
        assert not sb.files.exists(f"{d}/new.txt") and sb.files.read_text(f"{d}/src/util.go") == "util\n"

        c = sb.checkpoints.clone(b.id, clone)
        assert c == {"path": clone, "from_checkpoint_id": b.id}
        assert sb.files.read_text(f"{clone}/README.md") == "two\n"
        dirs = {x.path: x for x in sb.checkpoints.directories()}
        assert dirs[d].checkpoint_id == a.id and dirs[d].state == "ready" and clone in dirs

        sb.checkpoints.delete(b.id)
        assert b.id not in {x.id for x in sb.checkpoints.list()}
        assert sb.files.read_text(f"{clone}/README.md") == "two\n"  # a clone outlives its source
    finally:
        for p in (clone, d):
            try:
                rel = sb.checkpoints.release(p)
                assert rel.path == p
            except StrataError as e:
                if e.code != "directory_not_managed":
                    raise
        sb.exec.run(f"rm -rf {d} {clone}")
    assert d not in {x.path for x in sb.checkpoints.directories()}
