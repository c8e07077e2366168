"""VM snapshots (``sb.snapshots``): the whole sandbox — its disk and, by
default, its memory and devices, so processes come back running.

The seeds (OpenComputer, loam) call these *checkpoints*: their
``sandbox.create_checkpoint("after-build")``, ``list_checkpoints``,
``restore_checkpoint`` and ``delete_checkpoint`` are, here, methods of
Sandbox that call this class. strata's own ``sb.checkpoints`` are the
directory-level ones (checkpoints.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._client import quote
from ._errors import StrataError
from ._records import Record
from .checkpoints import Retention, retention_body

if TYPE_CHECKING:
    from .sandbox import Sandbox

SNAPSHOT_TIMEOUT = 600.0


def checkpoint_info(snapshot: Record) -> Record:
    """A VM snapshot's record as OpenComputer's CheckpointInfo, a dict with
    ``id`` (the snapshot's ref, ``sn-…``: ``Sandbox.create_from_checkpoint(cp["id"])``
    needs nothing else), ``sandboxId``, ``name``, ``status``, ``sizeBytes``
    and ``createdAt``; and ``snapshotId`` (``v1``, for ``sb.snapshots``),
    ``kind`` (``full`` or ``disk_only``) and ``comment``."""
    return Record(
        id=snapshot.get("ref") or snapshot.get("id"),
        sandboxId=snapshot.get("sandbox"),
        name=snapshot.get("name") or "",
        status=snapshot.get("status"),
        sizeBytes=snapshot.get("size_bytes", 0),
        createdAt=snapshot.get("created_at"),
        snapshotId=snapshot.get("id"),
        kind="full" if snapshot.get("memory") else "disk_only",
        comment=snapshot.get("comment") or "",
    )


def memory_of(memory: bool | None, kind: str | None) -> bool | None:
    """``memory``, or OpenComputer's ``kind`` for it (``full``, ``disk_only``);
    both, saying two things, is invalid_argument."""
    if kind is None:
        return memory
    if kind not in ("full", "disk_only"):
        raise StrataError("invalid_argument", f'kind must be "full" or "disk_only", not {kind!r}', 0, {"field": "kind"})
    m = kind == "full"
    if memory is not None and memory != m:
        raise StrataError("invalid_argument", f"memory={memory} and kind={kind!r} say two different things", 0, {"field": "kind"})
    return m


class Snapshots:
    """``sb.snapshots``: VM-level snapshots (see the module docstring).

    Ids are ``v1``, ``v2`` … (``auto-1`` … for the automatic ones); wherever
    an id is expected, the snapshot's ``ref`` (``sn-…``) and ``name`` are
    accepted too.
    """

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _path(self, *rest: str) -> str:
        return f"/v1/sandboxes/{quote(self._sb.id)}/snapshots" + "".join("/" + quote(r) for r in rest)

    def create(
        self,
        *,
        comment: str | None = None,
        memory: bool | None = None,
        name: str | None = None,
        retention: Retention | None = None,
        kind: str | None = None,
        retention_policy: Retention | None = None,
    ) -> Record:
        """Take a snapshot and return its record once ``ready``.
        ``memory`` (default true) keeps memory and devices, false the disk
        only (OpenComputer's ``kind="full"`` or ``"disk_only"``); ``name``
        (≤ 64 characters, unique in the sandbox: ``409 name_taken``);
        ``comment`` (≤ 256 bytes); ``retention`` (or OpenComputer's
        ``retention_policy``) an int N, or ``{"mode": "delete_oldest",
        "maxCount": N}``, lets the oldest unpinned snapshots of the kind go
        to keep at most N."""
        memory = memory_of(memory, kind)
        if retention is not None and retention_policy is not None:
            raise StrataError("invalid_argument", "give retention or retention_policy, not both", 0, {"field": "retention_policy"})
        if retention is None:
            retention = retention_policy
        body: dict[str, Any] = {}
        if comment is not None:
            body["comment"] = comment
        if memory is not None:
            body["memory"] = memory
        if name is not None:
            body["name"] = name
        r = retention_body(retention)
        if r is not None:
            body["retention"] = r
        return self._sb.client.request("POST", self._path(), body=body, timeout=SNAPSHOT_TIMEOUT).data  # type: ignore[no-any-return]

    def list(self) -> list[Record]:
        """Every snapshot of the sandbox, oldest first (never wakes it)."""
        return list(self._sb.client.request("GET", self._path()).data or [])

    def get(self, id: str) -> Record:
        """One snapshot's record (by id or name)."""
        return self._sb.client.request("GET", self._path(id)).data  # type: ignore[no-any-return]

    def restore(self, id: str, *, disk_only: bool = False, timeout: float = SNAPSHOT_TIMEOUT) -> Record:
        """Put the sandbox back to the snapshot; returns once it runs again:
        ``{"snapshot_id","auto_id","state"}`` (``auto_id``: the automatic
        snapshot of the state it replaced). ``disk_only`` boots its disk only."""
        body = {"disk_only": True} if disk_only else None
        data: Record = self._sb.client.request("POST", self._path(id, "restore"), body=body, timeout=timeout).data
        self._sb.wait_until("running", timeout=timeout)
        return data

    def delete(self, id: str) -> None:
        """Delete a snapshot (forks made from it are unaffected)."""
        self._sb.client.request("DELETE", self._path(id))

    def pin(self, id: str) -> Record:
        """Pin a snapshot: retention never deletes it. Its record."""
        return self._sb.client.request("POST", self._path(id, "pin")).data  # type: ignore[no-any-return]

    def unpin(self, id: str) -> Record:
        """Unpin a snapshot. Its record."""
        return self._sb.client.request("POST", self._path(id, "unpin")).data  # type: ignore[no-any-return]
