"""Files: whole, streamed (a large file), listed, stat'ed, removed, and trees as tar."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from strata import Sandbox, StrataError


def test_write_read_list_stat_remove(sb: Sandbox) -> None:
    sb.exec.run("rm -rf /tmp/sdkf && mkdir -p /tmp/sdkf")
    r = sb.files.write("/tmp/sdkf/a b.txt", "héllo\n", mode=0o600)
    assert r["size_bytes"] == len("héllo\n".encode())
    assert sb.files.read("/tmp/sdkf/a b.txt") == "héllo\n".encode()
    assert sb.files.read_text("/tmp/sdkf/a b.txt") == "héllo\n"
    sb.files.write("/tmp/sdkf/deep/er/x", b"\x00\x01", parents=True)
    names = {e["name"]: e for e in sb.files.list("/tmp/sdkf")}
    assert names["a b.txt"]["type"] == "file" and names["deep"]["type"] == "dir"
    st = sb.files.stat("/tmp/sdkf/a b.txt")
    assert st["type"] == "file" and st["size"] == 7 and st["mode"] == "0600"
    assert sb.files.stat("/tmp/sdkf/deep")["type"] == "dir"
    assert sb.files.exists("/tmp/sdkf/deep/er/x") and not sb.files.exists("/tmp/sdkf/nope")
    with pytest.raises(StrataError) as e:
        sb.files.remove("/tmp/sdkf/deep")
    assert e.value.status == 409 and e.value.code == "directory_not_empty"
    sb.files.remove("/tmp/sdkf/deep", recursive=True)
    sb.files.remove("/tmp/sdkf/a b.txt")
    assert sb.files.list("/tmp/sdkf") == []
    with pytest.raises(StrataError) as e:
        sb.files.read("/tmp/sdkf/gone")
    assert e.value.status == 404 and e.value.code == "file_not_found"
    assert any(e["name"] == "tmp" for e in sb.files.list("/"))  # the root route
    assert sb.files.stat("/")["type"] == "dir"


def test_large_streamed_file(sb: Sandbox) -> None:
    """64 MiB written from a generator and read back as a stream: neither side holds it whole."""
    size, block = 64 << 20, 1 << 20
    h = hashlib.sha256()

    def gen():
        for i in range(size // block):
            b = hashlib.sha256(str(i).encode()).digest() * (block // 32)
            h.update(b)
            yield b

    r = sb.files.write_stream("/tmp/big.bin", gen())
    assert r["size_bytes"] == size
    got = hashlib.sha256()
    n = 0
    with sb.files.read_stream("/tmp/big.bin") as f:
        assert f.size == size
        for chunk in f:
            got.update(chunk)
            n += len(chunk)
    assert n == size and got.hexdigest() == h.hexdigest()
    assert sb.exec.run("sha256sum /tmp/big.bin").stdout.split()[0] == h.hexdigest()
    with sb.files.read_stream("/tmp/big.bin", offset=block, length=10) as f:
        assert f.read() == hashlib.sha256(b"1").digest()[:10]
    with open(os.devnull, "rb") as empty:
        sb.files.write_stream("/tmp/big.bin", empty)  # a file object: replaced by an empty file
    assert sb.files.stat("/tmp/big.bin")["size"] == 0
    sb.files.remove("/tmp/big.bin")


def test_upload_download_tar(sb: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "sub" / "data.bin").write_bytes(os.urandom(300_000))
    (src / "link").symlink_to("sub/data.bin")
    sb.exec.run("rm -rf /tmp/up")
    r = sb.files.upload(src, "/tmp/up")
    assert r["size_bytes"] >= 300_000
    assert sb.exec.run("/tmp/up/run.sh").stdout == "ran\n"
    assert sb.exec.run("readlink /tmp/up/link").stdout == "sub/data.bin\n"
    dest = tmp_path / "dest"
    names = sb.files.download("/tmp/up", dest)
    assert names
    assert (dest / "sub" / "data.bin").read_bytes() == (src / "sub" / "data.bin").read_bytes()
    assert os.access(dest / "run.sh", os.X_OK)
    assert os.readlink(dest / "link") == "sub/data.bin"
    sb.files.remove("/tmp/up", recursive=True)
    root = tmp_path / "root"
    (root / "tmp" / f"sdkroot-{os.getpid()}").mkdir(parents=True)
    (root / "tmp" / f"sdkroot-{os.getpid()}" / "f").write_text("at the root\n")
    sb.files.upload(root, "/")  # a tar unpacked into / (the root route)
    assert sb.files.read_text(f"/tmp/sdkroot-{os.getpid()}/f") == "at the root\n"
    sb.files.remove(f"/tmp/sdkroot-{os.getpid()}", recursive=True)
