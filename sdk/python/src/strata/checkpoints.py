"""Directory checkpoints (``sb.checkpoints``): the file state of ONE directory
inside a sandbox, captured and restored at its path while the sandbox keeps
running (processes and memory are not touched).

These are not the seeds' ``create_checkpoint``: that one is a VM snapshot of
the whole sandbox (``sb.snapshots``, see snapshots.py). Here the word
*checkpoint* means the CreateOS document's directory checkpoint.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from ._client import quote, quote_path
from ._errors import StrataError
from ._records import Record

if TYPE_CHECKING:
    from .sandbox import Sandbox

Retention = int | dict[str, Any]


def retention_body(retention: Retention | None) -> dict[str, Any] | None:
    """An int n is ``{"mode":"delete_oldest","max_count":n}``; a dict is sent
    with its ``maxCount`` (OpenComputer's spelling) as ``max_count`` and
    ``mode`` ``delete_oldest`` when it has none."""
    if retention is None:
        return None
    if isinstance(retention, int):
        return {"mode": "delete_oldest", "max_count": retention}
    body = dict(retention)
    if "maxCount" in body:
        if "max_count" in body and body["max_count"] != body["maxCount"]:
            raise StrataError("invalid_argument", "a retention with maxCount and max_count that differ", 0, {"field": "retention"})
        body["max_count"] = body.pop("maxCount")
    body.setdefault("mode", "delete_oldest")
    return body


class Checkpoints:
    """``sb.checkpoints``: directory-level checkpoints (see the module docstring).

    Wherever an id is expected (``cp_…``), a name that exactly one
    checkpoint of the sandbox has is accepted too, as in ``createos``.
    """

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _path(self, *rest: str) -> str:
        return f"/v1/sandboxes/{quote(self._sb.id)}" + "".join("/" + quote(r) for r in rest)

    def _id(self, id_or_name: str) -> str:
        if id_or_name.startswith("cp_"):
            return id_or_name
        matches = [c for c in self.list() if c.get("name") == id_or_name]
        if len(matches) == 1:
            return str(matches[0]["id"])
        if not matches:
            raise StrataError("checkpoint_not_found", f"no checkpoint is named {id_or_name!r}", 404, {"checkpoint_id": id_or_name})
        raise StrataError("invalid_argument", f"{len(matches)} checkpoints are named {id_or_name!r}: use an id", 0, {"field": "checkpoint"})

    def create(self, path: str, *, name: str | None = None, retention: Retention | None = None) -> Record:
        """Capture the directory at ``path`` (enrolling it on its first
        capture). ``name`` is a display name (not unique, ≤ 128 bytes);
        ``retention`` an int N keeps at most N checkpoints of the directory
        (the oldest go). Sent with an Idempotency-Key, retried safely.
        Returns the record ``{"id","path","name","created_at","parent_id"?,
        "auto","size_bytes"}``. ``409 directory_busy`` lists ``holders``."""
        body: dict[str, Any] = {"path": path}
        if name is not None:
            body["name"] = name
        r = retention_body(retention)
        if r is not None:
            body["retention"] = r
        return self._sb.client.request("POST", self._path("checkpoints"), body=body, idempotent=True).data  # type: ignore[no-any-return]

    def list(self, path: str | None = None) -> list[Record]:
        """Every checkpoint of the sandbox, oldest first; with ``path``,
        only that directory's (filtered here: the route takes no query)."""
        data = self._sb.client.request("GET", self._path("checkpoints")).data or []
        return [c for c in data if path is None or c.get("path") == path]

    def restore(self, id: str) -> Record:
        """Put the checkpoint's directory back as it was (unsaved changes are
        kept first as an automatic checkpoint: ``safety_checkpoint_id``).
        Sent with an Idempotency-Key, retried safely."""
        return self._sb.client.request("POST", self._path("checkpoints", self._id(id), "restore"), idempotent=True).data  # type: ignore[no-any-return]

    def delete(self, id: str) -> None:
        """Delete a checkpoint's record (never the live directory)."""
        self._sb.client.request("DELETE", self._path("checkpoints", self._id(id)))

    def changes(self, id: str, *, against: str | None = None) -> list[Record]:
        """What the checkpoint changed against its parent, or with
        ``against="live"`` the live directory against it, or with
        ``against=<checkpoint>`` it against another of the same directory:
        ``[{"path","change","type","size"}]``."""
        query = {"against": against if against in (None, "live") else self._id(against)}  # type: ignore[arg-type]
        return list(self._sb.client.request("GET", self._path("checkpoints", self._id(id), "changes"), query=query).data or [])

    def stat_file(self, id: str, path: str = ".") -> Record:
        """One entry as it is in the checkpoint, ``path`` relative to the
        directory's root (``"."`` the root): ``{"path","type","mode","size",
        "mtime"}`` and ``content`` (base64, files ≤ 4 MiB), ``target`` or ``entries``."""
        rel = quote_path(path) if path not in ("", ".", "/") else ""
        p = self._path("checkpoints", self._id(id), "files") + ("/" + rel if rel else "")
        return self._sb.client.request("GET", p).data  # type: ignore[no-any-return]

    def read_file(self, id: str, path: str) -> bytes:
        """A file's bytes as they are in the checkpoint (``path`` relative
        to the directory's root; files over 4 MiB are ``413 file_too_large``)."""
        entry = self.stat_file(id, path)
        if entry.get("type") != "file":
            raise StrataError("not_a_file", f"{path} is a {entry.get('type')} in the checkpoint", 409, {"path": path})
        return base64.b64decode(entry.get("content") or "")

    def list_files(self, id: str, dir: str = ".") -> list[Record]:
        """A directory's entries in the checkpoint: ``[{"name","type"}]``."""
        entry = self.stat_file(id, dir)
        if entry.get("type") != "dir":
            raise StrataError("not_a_directory", f"{dir} is a {entry.get('type')} in the checkpoint", 409, {"path": dir})
        return list(entry.get("entries") or [])

    def restore_paths(self, id: str, paths: list[str]) -> Record:
        """Put only these paths (relative to the root, 1–100) back as they
        are in the checkpoint; the rest of the directory is untouched."""
        return self._sb.client.request("POST", self._path("checkpoints", self._id(id), "restore-paths"), body={"paths": list(paths)}).data  # type: ignore[no-any-return]

    def clone(self, id: str, to: str) -> Record:
        """A new managed directory at ``to`` (must not exist) with the
        checkpoint's content, sharing its layers: ``{"path","from_checkpoint_id"}``."""
        return self._sb.client.request("POST", self._path("checkpoints", self._id(id), "clone"), body={"path": to}).data  # type: ignore[no-any-return]

    def directories(self) -> list[Record]:
        """Every managed directory: ``{"path","checkpoint_id","state","size_bytes"}``."""
        return list(self._sb.client.request("GET", self._path("directories")).data or [])

    def release(self, path: str) -> Record:
        """Make a managed directory a plain one again, deleting its
        checkpoints: ``{"path","deleted_checkpoint_ids"}``. Cannot be undone."""
        return self._sb.client.request("POST", self._path("directories", "release"), body={"path": path}).data  # type: ignore[no-any-return]
