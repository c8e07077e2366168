"""Files in and out of a running sandbox (``/v1/sandboxes/{id}/files/{path…}``).

Bodies stream both ways: ``write_stream`` sends a file object or an iterable
of bytes with chunked encoding, ``read_stream`` returns a file-like object
that is also an iterator of chunks, and ``upload``/``download`` move whole
directories as tar streams (``tarfile`` in stream mode) without holding them
in memory.
"""

from __future__ import annotations

import copy
import http.client
import io
import os
import tarfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterable, Iterator

from ._client import quote, quote_path
from ._errors import StrataError
from ._records import Record

if TYPE_CHECKING:
    from .sandbox import Sandbox

CHUNK = 64 * 1024
TRANSFER_TIMEOUT = 600.0


class FileStream(io.RawIOBase):
    """A file being read from a sandbox: ``read(n)``, ``readinto``, and
    iteration over chunks of bytes (up to 64 KiB each). Close it (or use it
    as a context manager) when done. ``size`` is its length, ``mode`` its
    permission bits (``"0644"``), ``mtime`` its modification time."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        super().__init__()
        self._conn = conn
        self._resp = resp
        length = resp.getheader("Content-Length")
        self.size: int | None = int(length) if length and length.isdigit() else None
        self.mode: str | None = resp.getheader("X-File-Mode")
        self.mtime: str | None = resp.getheader("X-File-Mtime") or resp.getheader("Last-Modified")
        self.content_type: str = resp.getheader("Content-Type") or ""

    def readable(self) -> bool:
        """True: a FileStream is read."""
        return True

    def readinto(self, b: Any) -> int:
        """Read into a buffer; 0 at the end."""
        try:
            return self._resp.readinto(b)
        except (OSError, http.client.HTTPException) as e:
            raise StrataError("network_error", f"reading a file: {e!r}") from None

    def read(self, size: int = -1) -> bytes:
        """Read up to size bytes (all that is left with -1)."""
        try:
            return self._resp.read() if size is None or size < 0 else self._resp.read(size)
        except (OSError, http.client.HTTPException) as e:
            raise StrataError("network_error", f"reading a file: {e!r}") from None

    def __iter__(self) -> Iterator[bytes]:  # type: ignore[override]
        return self

    def __next__(self) -> bytes:
        chunk = self.read(CHUNK)
        if not chunk:
            raise StopIteration
        return chunk

    def close(self) -> None:
        """Close the answer and its connection."""
        if not self.closed:
            self._resp.close()
            self._conn.close()
        super().close()


class Files:
    """``sb.files``: files and directories of the sandbox (paths absolute, in the guest)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _path(self, path: str) -> str:
        if not path.startswith("/"):
            raise StrataError("invalid_argument", f"a sandbox path is absolute: {path!r}", 0, {"field": "path"})
        rel = quote_path(path)
        base = f"/v1/sandboxes/{quote(self._sb.id)}/files"
        return base + ("/" + rel if rel else "")

    # -- whole files ------------------------------------------------------

    def write(
        self,
        path: str,
        data: bytes | str,
        *,
        mode: int | str | None = None,
        parents: bool = False,
        mtime: str | None = None,
    ) -> Record:
        """Write a file (created or replaced atomically) from bytes (a str
        as UTF-8). ``mode`` as an int (``0o755``) or octal string; ``parents``
        makes missing directories; ``mtime`` RFC 3339. Returns
        ``{"path","size_bytes"}``."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        return self._put(path, bytes(data), mode=mode, parents=parents, mtime=mtime, retry=True)

    def write_stream(
        self,
        path: str,
        source: BinaryIO | Iterable[bytes],
        *,
        mode: int | str | None = None,
        parents: bool = False,
        mtime: str | None = None,
    ) -> Record:
        """Write a file from a binary file object or an iterable of bytes,
        streamed (chunked encoding: never held whole). Returns
        ``{"path","size_bytes"}``."""
        return self._put(path, source, mode=mode, parents=parents, mtime=mtime, retry=False)

    def _put(self, path: str, body: Any, *, mode: int | str | None, parents: bool, mtime: str | None, retry: bool, content_type: str = "application/octet-stream") -> Record:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        if mode is not None:
            headers["X-File-Mode"] = format(mode, "04o") if isinstance(mode, int) else mode
        if mtime is not None:
            headers["X-File-Mtime"] = mtime
        if isinstance(body, (bytes, bytearray)):
            headers["Content-Length"] = str(len(body))
        conn, resp = self._sb.client.stream(
            "PUT", self._path(path), query={"parents": "true"} if parents else None,
            headers=headers, body=body, retry=retry, timeout=TRANSFER_TIMEOUT,
        )
        try:
            return _json_data(resp)
        finally:
            conn.close()

    def read(self, path: str) -> bytes:
        """A file's bytes (``409 not_a_file`` for a directory)."""
        with self.read_stream(path) as f:
            return f.read()

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A file's content as text."""
        return self.read(path).decode(encoding)

    def read_stream(self, path: str, *, offset: int | None = None, length: int | None = None) -> FileStream:
        """A file as a FileStream (file-like, and an iterator of chunks),
        optionally from byte ``offset`` and at most ``length`` bytes (a range)."""
        headers = {"Accept": "application/octet-stream"}
        if offset is not None or length is not None:
            start = offset or 0
            end = "" if length is None else str(start + length - 1)
            headers["Range"] = f"bytes={start}-{end}"
        conn, resp = self._sb.client.stream("GET", self._path(path), headers=headers, retry=True, timeout=TRANSFER_TIMEOUT)
        if (resp.getheader("Content-Type") or "").startswith("application/json"):
            data = _json_data(resp)
            conn.close()
            raise StrataError("not_a_file", f"{path} is a directory", 409, {"path": path, "entries": data.get("entries")})
        return FileStream(conn, resp)

    # -- directories and metadata ------------------------------------------

    def list(self, dir: str = "/") -> list[Record]:
        """A directory's entries: ``{"name","type","size_bytes","mode","mtime","target"?}``."""
        conn, resp = self._sb.client.stream("GET", self._path(dir), headers={"Accept": "application/json"}, retry=True)
        try:
            if not (resp.getheader("Content-Type") or "").startswith("application/json"):
                raise StrataError("not_a_directory", f"{dir} is a file", 409, {"path": dir})
            return list(_json_data(resp).get("entries") or [])
        finally:
            conn.close()

    def stat(self, path: str) -> Record:
        """What is at path (``HEAD``): ``{"path","type" ("file" or "dir"),
        "size","mode","mtime"}``; StrataError ``file_not_found`` when nothing is."""
        conn, resp = self._sb.client.stream("HEAD", self._path(path), retry=True)
        try:
            resp.read()
            ctype = resp.getheader("Content-Type") or ""
            length = resp.getheader("Content-Length")
            return Record(
                path=path,
                type="file" if ctype.startswith("application/octet-stream") else "dir",
                size=int(length) if length and length.isdigit() else None,
                mode=resp.getheader("X-File-Mode"),
                mtime=resp.getheader("X-File-Mtime") or resp.getheader("Last-Modified"),
            )
        finally:
            conn.close()

    def exists(self, path: str) -> bool:
        """True when something is at path."""
        try:
            self.stat(path)
            return True
        except StrataError as e:
            if e.code == "file_not_found":
                return False
            raise

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or an empty directory (a whole tree with ``recursive``)."""
        conn, resp = self._sb.client.stream("DELETE", self._path(path), query={"recursive": "true"} if recursive else None)
        try:
            resp.read()
        finally:
            conn.close()

    # -- trees as tar -------------------------------------------------------

    def upload(self, local_dir: str | os.PathLike[str], dir: str) -> Record:
        """Copy a local directory's tree into the sandbox directory ``dir``
        (made), as a tar streamed while it is written: modes, mtimes and
        symlinks kept. Returns ``{"path","size_bytes"}``. When the local
        tree cannot be read whole, the request is broken off (the server
        sees a body that does not end, never a whole but partial tar) and
        StrataError ``upload_failed`` is raised."""
        src = Path(local_dir)
        if not src.is_dir():
            raise StrataError("invalid_argument", f"{src} is not a local directory", 0, {"field": "local_dir"})
        r, w = os.pipe()
        reader = os.fdopen(r, "rb")
        writer = os.fdopen(w, "wb")
        failure: list[BaseException] = []

        def produce() -> None:
            try:
                with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tf:
                    for entry in sorted(src.iterdir()):
                        tf.add(str(entry), arcname=entry.name)
            except BaseException as e:  # reported by upload
                failure.append(e)
            finally:
                try:
                    writer.close()
                except OSError:
                    pass

        def produced() -> None:
            """At the pipe's end: raise if the producer failed, so the
            chunked body never ends cleanly and the request is aborted."""
            t.join()
            if failure and not isinstance(failure[0], BrokenPipeError):
                raise StrataError("upload_failed", f"reading {src}: {failure[0]!r}; the request was broken off")

        t = threading.Thread(target=produce, name="strata-upload", daemon=True)
        t.start()
        try:
            return self._put(dir, _Chunks(reader, produced), mode=None, parents=False, mtime=None, retry=False, content_type="application/x-tar")
        except StrataError:
            reader.close()
            t.join()
            produced()  # the producer's failure, when there is one, is the cause
            raise
        finally:
            reader.close()
            t.join()

    def download(self, dir: str, local_dir: str | os.PathLike[str]) -> list[str]:
        """Copy the sandbox directory ``dir``'s tree into ``local_dir``
        (made), from a tar read as it streams. Entries that would land
        outside ``local_dir`` are refused. Modes are the sandbox's less this
        process's umask, never setuid, setgid or sticky, and files are this
        process's user's (as tar does for a user who is not root; the same
        as ``createos sandbox cp`` and the TypeScript SDK). Returns the
        names extracted."""
        dest = Path(local_dir)
        dest.mkdir(parents=True, exist_ok=True)
        conn, resp = self._sb.client.stream("GET", self._path(dir), headers={"Accept": "application/x-tar"}, retry=True, timeout=TRANSFER_TIMEOUT)
        ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if ctype not in ("application/x-tar", "application/tar"):
            conn.close()
            if ctype == "application/octet-stream":
                raise StrataError("not_a_directory", f"{dir} is a file, not a directory", 409, {"path": dir})
            raise StrataError(
                f"http_{resp.status}", f"GET {dir}: the answer is {ctype or 'untyped'}, not a tar",
                resp.status, {"path": dir}, resp.getheader("X-Request-Id"),
            )
        names: list[str] = []
        root = dest.resolve()
        keep = _local_modes(_umask())
        try:
            with tarfile.open(fileobj=resp, mode="r|") as tf:
                for member in tf:
                    target = (root / member.name.lstrip("/")).resolve()
                    if target != root and root not in target.parents:
                        raise StrataError("download_failed", f"tar entry {member.name!r} would land outside {dest}", 0, {"path": member.name})
                    if member.islnk():
                        link = (root / member.linkname.lstrip("/")).resolve()
                        if root not in link.parents:
                            raise StrataError("download_failed", f"tar hard link {member.name!r} leads outside {dest}", 0, {"path": member.name})
                    if hasattr(tarfile, "tar_filter"):
                        tf.extract(member, root, filter=lambda m, path: _local_member(tarfile.tar_filter(m, path), keep, m.mode))
                    else:  # Python 3.11 before 3.11.4: checked above
                        tf.extract(_local_member(member, keep), root)
                    names.append(member.name)
        except (tarfile.TarError, http.client.HTTPException, OSError, ValueError) as e:
            raise StrataError("download_failed", f"reading the tar of {dir}: {e!r}") from None
        finally:
            conn.close()
        return names


def _umask() -> int:
    """This process's umask, read where Linux shows it (/proc/self/status)
    without changing it; elsewhere set and put back at once (os.umask has no
    read-only form)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split(":", 1)[1].strip(), 8) & 0o777
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old & 0o777


def _local_modes(umask: int) -> int:
    """The mode bits a download keeps: the permissions less umask, never
    setuid, setgid or sticky (a tar from a sandbox must not plant them here)."""
    return 0o777 & ~umask


def _local_member(member: tarfile.TarInfo, keep: int, mode: int | None = None) -> tarfile.TarInfo:
    """member as it is written here: the bits of keep of its mode (of
    ``mode`` when given: the tar's, where a filter changed the member's), and
    this process's user as its owner (extracting as root would otherwise give
    files the guest's users)."""
    m = copy.copy(member)
    mode = m.mode if mode is None else mode
    if mode is not None:
        m.mode = mode & keep
    m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
    return m


class _Chunks:
    """A pipe read as an iterable of chunks (for chunked encoding); at the
    pipe's end ``at_end()`` runs, and may raise to abort the request."""

    def __init__(self, f: BinaryIO, at_end: Any = None) -> None:
        self._f = f
        self._at_end = at_end

    def __iter__(self) -> Iterator[bytes]:
        while True:
            b = self._f.read(CHUNK)
            if not b:
                if self._at_end is not None:
                    self._at_end()
                return
            yield b


def _json_data(resp: http.client.HTTPResponse) -> Record:
    import json

    from ._records import to_record

    try:
        raw = resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise StrataError("network_error", f"reading an answer: {e!r}") from None
    if not raw:
        return Record()
    try:
        env = json.loads(raw)
    except ValueError:
        raise StrataError(f"http_{resp.status}", f"HTTP {resp.status} with a body that is not JSON", resp.status, {}, resp.getheader("X-Request-Id")) from None
    data = env.get("data") if isinstance(env, dict) else None
    out = to_record(data)
    return out if isinstance(out, Record) else Record(value=out)
