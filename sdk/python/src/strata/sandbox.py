"""Sandboxes: QEMU microVMs with a guest daemon, and their lifecycle.

Which word means which level:

- ``sb.checkpoints`` — **directory checkpoints**: one directory's files,
  inside a running sandbox (checkpoints.py);
- ``sb.snapshots`` — **VM snapshots**: the whole machine, memory included by
  default (snapshots.py). The seeds call these checkpoints, so
  ``sb.create_checkpoint(name)``, ``list_checkpoints``,
  ``restore_checkpoint``, ``delete_checkpoint``, ``sb.fork`` and
  ``Sandbox.create_from_checkpoint`` all work on VM snapshots.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, overload

from ._client import Response, Strata, quote, resolve
from ._errors import StrataError
from ._records import Record
from .checkpoints import Checkpoints, Retention
from .exec import Exec
from .files import Files
from .network import Network, NetworkSetting
from .snapshots import Snapshots, checkpoint_info
from .tokens import Access, AccessToken

_REF = re.compile(r"sn-[a-z0-9]{24}")
TRANSITIONAL = frozenset({"creating", "pausing", "resuming", "stopping", "destroying", "unresponsive"})
WAIT_TIMEOUT = 300.0


class ForkList(list["Sandbox"]):
    """The sandboxes of ``sb.fork(…, count=N)``, in the order of their names;
    ``failed`` lists the forks the server could not make (``{"code","message"}``)."""

    failed: list[Record]

    def __init__(self, items: list["Sandbox"], failed: list[Record]) -> None:
        super().__init__(items)
        self.failed = failed


class Sandbox:
    """A sandbox: ``Sandbox.create()``, ``Sandbox.connect(id)``, ``Sandbox.list()``.

    Parts: ``exec`` (commands and sessions), ``files``, ``checkpoints``
    (directory-level), ``snapshots`` (VM-level; the seeds' checkpoints),
    ``access_token``. Every method is synchronous; ``AsyncSandbox`` is the
    same API for asyncio. ``client`` is the configured ``Strata`` (the
    module's default when none is given).
    """

    id: str
    client: Strata
    exec: Exec
    files: Files
    checkpoints: Checkpoints
    snapshots: Snapshots
    access_token: AccessToken
    network: Network

    def __init__(self, id: str, *, client: Strata | None = None, info: Record | None = None) -> None:
        self.id = id
        self.client = resolve(client)
        self._info: Record | None = info
        self.exec = Exec(self)
        self.files = Files(self)
        self.checkpoints = Checkpoints(self)
        self.snapshots = Snapshots(self)
        self.access_token = AccessToken(self)
        self.network = Network(self)

    def __repr__(self) -> str:
        state = self._info.get("state") if self._info else None
        return f"Sandbox(id={self.id!r}, state={state!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def _path(self, *rest: str) -> str:
        return f"/v1/sandboxes/{quote(self.id)}" + "".join("/" + quote(r) for r in rest)

    # -- making and finding sandboxes --------------------------------------

    @classmethod
    def create(
        cls,
        *,
        name: str | None = None,
        memory_mib: int | None = None,
        vcpus: int | None = None,
        disk_gib: int | None = None,
        access: Access | None = None,
        env: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        network: NetworkSetting | None = None,
        wait: bool = True,
        timeout: float = WAIT_TIMEOUT,
        client: Strata | None = None,
    ) -> "Sandbox":
        """Create a sandbox (a microVM booted from the guest image) and
        return it once ``running`` (unless ``wait=False``). ``memory_mib``
        (512; 128–8192), ``vcpus`` (1; 1–4), ``disk_gib`` (4; 1–64); ``name``
        unique in the account (``409 name_taken``), not starting with
        ``sb-``, and accepted wherever the id is; ``access``: what
        processes inside may do with the key they are handed (see
        ``set_access``; default ``{"scopes": ["checkpoints", "snapshots"]}``);
        ``env``: the environment of every exec and session, under each
        call's own (at most 64 entries with a call's; not a secret store);
        ``labels``: the sandbox's labels (``Sandbox.list(labels=…)``);
        ``network``: its network setting (see ``Network``; default
        ``{"egress": "all"}``). Sent with an Idempotency-Key, retried
        safely."""
        body: dict[str, Any] = {}
        for k, v in (("name", name), ("memory_mib", memory_mib), ("vcpus", vcpus), ("disk_gib", disk_gib), ("access", access), ("env", env), ("labels", labels), ("network", network)):
            if v is not None:
                body[k] = v
        return cls._create(body, wait, timeout, resolve(client))

    @classmethod
    def _create(cls, body: dict[str, Any], wait: bool, timeout: float, client: Strata) -> "Sandbox":
        resp = client.request("POST", "/v1/sandboxes", body=body, idempotent=True, timeout=timeout)
        sb = cls(resp.data["id"], client=client, info=resp.data)
        if wait:
            try:
                sb._wait(resp, "running", timeout)
            except StrataError as e:
                # The sandbox exists: its id goes with the error, for cleaning up.
                raise StrataError(e.code, f"{e.message} (the sandbox {sb.id} was made: kill it when done)", e.status, {**e.data, "id": sb.id}, e.request_id) from None
        return sb

    @classmethod
    def create_from_checkpoint(
        cls,
        snapshot_id: str | dict[str, Any],
        *,
        sandbox: str | None = None,
        name: str | None = None,
        access: Access | None = None,
        env: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        network: NetworkSetting | None = None,
        wait: bool = True,
        timeout: float = WAIT_TIMEOUT,
        client: Strata | None = None,
    ) -> "Sandbox":
        """A fork (the seeds' name): a new sandbox from a VM snapshot,
        running once returned (``timeout``: how long to wait, in seconds,
        OpenComputer's option). ``snapshot_id`` is a checkpoint's ``id``
        (its ref, ``sn-…``: it names the snapshot on the whole deployment,
        as in ``Sandbox.create_from_checkpoint(cp["id"])``), a checkpoint
        or snapshot dict, or a snapshot's ``v1``-style id or name of
        sandbox ``sandbox`` (default: the configured
        ``CREATEOS_SANDBOX_ID``). Its ``access``, ``env`` and ``labels``
        are its own, never its source's; its ``network`` is its source's
        unless given."""
        c = resolve(client)
        if isinstance(snapshot_id, dict):
            ref = snapshot_id.get("ref") or (snapshot_id.get("id") if "sandboxId" in snapshot_id else None)
            if ref:
                snapshot_id = str(ref)
            else:
                sandbox = sandbox or snapshot_id.get("sandbox")
                snapshot_id = str(snapshot_id.get("id"))
        source: dict[str, Any] = {"snapshot": snapshot_id}
        if not _REF.fullmatch(snapshot_id) or sandbox:
            src = sandbox or c.sandbox_id
            if not src:
                raise StrataError(
                    "invalid_argument",
                    f"create_from_checkpoint({snapshot_id!r}): an id or a name is a snapshot of one sandbox; pass sandbox=, or the snapshot's ref (sn-…)",
                    0,
                    {"field": "sandbox"},
                )
            source = {"sandbox": src, "snapshot": snapshot_id}
        body: dict[str, Any] = {"from": source}
        for k, v in (("name", name), ("access", access), ("env", env), ("labels", labels), ("network", network)):
            if v is not None:
                body[k] = v
        return cls._create(body, wait, timeout, c)

    @classmethod
    def connect(cls, id: str | None = None, *, client: Strata | None = None) -> "Sandbox":
        """The sandbox ``id`` (its id, or its name); without one, the
        configured sandbox (``CREATEOS_SANDBOX_ID``, from the credentials
        file inside a sandbox: that sandbox). An id makes no call (inside a
        sandbox its key may not read sandbox records); a name is read once
        (``GET``), so that ``.id`` is the sandbox's id, unless the key may
        not read the record (``403``: it is kept as given, and works as
        well: every route takes a name). A name of no sandbox is
        ``sandbox_not_found``."""
        c = resolve(client)
        sid = id or c.sandbox_id
        if not sid:
            raise StrataError("invalid_argument", "no sandbox id: pass one, or set CREATEOS_SANDBOX_ID")
        sb = cls(sid, client=c)
        if not sid.startswith("sb-"):  # names never start with sb- (ids the API makes always do)
            try:
                rec = c.request("GET", sb._path()).data
            except StrataError as e:
                if e.status != 403:
                    raise
            else:
                sb = cls(str(rec["id"]), client=c, info=rec)
        return sb

    @classmethod
    def list(cls, *, labels: dict[str, str] | None = None, client: Strata | None = None) -> list["Sandbox"]:
        """Every sandbox of the account, oldest first (all pages); with
        ``labels``, those that have every one of them. Their records have
        no ``env`` (``refresh()`` reads it)."""
        c = resolve(client)
        label = [f"{k}={v}" for k, v in (labels or {}).items()] or None
        out: list[Sandbox] = []
        offset = 0
        while True:
            data = c.request("GET", "/v1/sandboxes", query={"limit": 500, "offset": offset, "label": label}).data
            page = data.get("data") or []
            out += [cls(r["id"], client=c, info=r) for r in page]
            total = int((data.get("pagination") or {}).get("total") or 0)
            offset += len(page)
            if not page or offset >= total:
                return out

    # -- state -------------------------------------------------------------

    @property
    def info(self) -> Record:
        """The sandbox's record as last read (read now when never read):
        ``{"id","name","state","memory_mib","vcpus","disk_gib","created_at",…}``."""
        if self._info is None:
            return self.refresh()
        return self._info

    @property
    def name(self) -> str:
        """The sandbox's name."""
        return str(self.info.get("name") or self.id)

    @property
    def state(self) -> str:
        """The sandbox's state, read now."""
        return str(self.refresh().get("state"))

    def refresh(self) -> Record:
        """Read the sandbox's record again (``GET /v1/sandboxes/{id}``)."""
        self._info = self.client.request("GET", self._path()).data
        return self._info

    def _wait(self, resp: Response | None, target: str, timeout: float) -> Record:
        """Poll until the sandbox is in ``target``: ``GET …?wait_s=`` (the
        server answers as soon as the state changes), honouring
        ``X-Poll-After`` between polls. Raises with the record's ``error``
        when it ends in ``error``."""
        deadline = time.monotonic() + timeout
        rec: Record = resp.data if resp is not None else self.refresh()
        poll_after = _poll_after(resp) if resp is not None else None
        while True:
            self._info = rec
            state = rec.get("state")
            if state == target:
                return rec
            if state == "error":
                msg = rec.get("error") or "the sandbox ended in state error"
                raise StrataError("sandbox_error", f"sandbox {self.id}: {msg}", 0, rec)
            if state not in TRANSITIONAL and resp is None:
                why = (rec.get("last_error") or {}).get("message")
                raise StrataError(
                    "sandbox_state",
                    f"sandbox {self.id} is {state}, not on its way to {target}" + (f": {why}" if why else ""),
                    409, {"state": state, "last_error": rec.get("last_error")},
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise StrataError("wait_timeout", f"sandbox {self.id} still {state} after {timeout:.0f} s", 0, {"state": state})
            if poll_after:
                time.sleep(min(poll_after, left))
            wait_s = max(1, min(20, int(deadline - time.monotonic())))
            r = self.client.request("GET", self._path(), query={"wait_s": wait_s}, timeout=wait_s + 30)
            rec, poll_after, resp = r.data, _poll_after(r), None

    def wait_until(self, state: str = "running", *, timeout: float = WAIT_TIMEOUT) -> Record:
        """Wait until the sandbox is in ``state`` (default ``running``) and
        return its record; StrataError when it ends in ``error``, rests in
        another state, or ``timeout`` seconds pass (``wait_timeout``)."""
        return self._wait(None, state, timeout)

    # -- lifecycle -----------------------------------------------------------

    def set_access(self, access: Access) -> Record:
        """Set what processes inside the sandbox may do with the key they
        are handed (its channel key): ``{"scopes": [...]}``, or ``"none"``
        for no key at all (every call from inside is then refused, whatever
        key it carries). It holds from the next call on, for the key
        already in the guest too. Needs an account key; returns the record
        (``409 sandbox_not_a_vm`` for a configured sandbox)."""
        self._info = self.client.request("PUT", self._path("access"), body=access).data
        return self._info

    def set_labels(self, labels: dict[str, str]) -> Record:
        """Replace the sandbox's labels (``{}`` takes them all away); needs
        an account key; returns the record (``409 sandbox_not_a_vm`` for a
        configured sandbox)."""
        self._info = self.client.request("PUT", self._path("labels"), body=dict(labels)).data
        return self._info

    def kill(self) -> Record:
        """Delete the sandbox (``DELETE``): its VM, disk, checkpoints and
        snapshots. Returns ``{"id","state":"destroyed"}``."""
        resp = self.client.request("DELETE", self._path(), timeout=WAIT_TIMEOUT)
        self._info = resp.data
        return resp.data  # type: ignore[no-any-return]

    def pause(self, *, wait: bool = True, timeout: float = WAIT_TIMEOUT) -> Record:
        """Pause: the guest's memory goes to the host's disk. Returns once
        ``paused`` unless ``wait=False``."""
        resp = self.client.request("POST", self._path("pause"), timeout=timeout)
        return self._wait(resp, "paused", timeout) if wait else resp.data

    def resume(self, *, wait: bool = True, timeout: float = WAIT_TIMEOUT) -> Record:
        """Resume a paused sandbox; returns once ``running`` unless ``wait=False``."""
        resp = self.client.request("POST", self._path("resume"), timeout=timeout)
        return self._wait(resp, "running", timeout) if wait else resp.data

    def stop(self) -> Record:
        """Shut the sandbox down cleanly (``stopped``; its disk stays)."""
        resp = self.client.request("POST", self._path("stop"), timeout=WAIT_TIMEOUT)
        self._info = resp.data
        return resp.data  # type: ignore[no-any-return]

    def start(self, *, wait: bool = True, timeout: float = WAIT_TIMEOUT) -> Record:
        """Boot a stopped (or ``error``) sandbox from its disk; returns once
        ``running`` unless ``wait=False``."""
        resp = self.client.request("POST", self._path("start"), timeout=timeout)
        return self._wait(resp, "running", timeout) if wait else resp.data

    # -- forks ---------------------------------------------------------------

    @overload
    def fork(
        self, snapshot: str, *, name: str | None = ..., count: None = ..., access: Access | None = ...,
        env: dict[str, str] | None = ..., labels: dict[str, str] | None = ..., network: NetworkSetting | None = ..., wait: bool = ..., timeout: float = ...,
    ) -> "Sandbox": ...

    @overload
    def fork(
        self, snapshot: str, *, name: str | None = ..., count: int, access: Access | None = ...,
        env: dict[str, str] | None = ..., labels: dict[str, str] | None = ..., network: NetworkSetting | None = ..., wait: bool = ..., timeout: float = ...,
    ) -> ForkList: ...

    def fork(
        self,
        snapshot: str,
        *,
        name: str | None = None,
        count: int | None = None,
        access: Access | None = None,
        env: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        network: NetworkSetting | None = None,
        wait: bool = True,
        timeout: float = WAIT_TIMEOUT,
    ) -> "Sandbox | ForkList":
        """New sandboxes from VM snapshot ``snapshot`` (its id, ref — a
        checkpoint's ``id`` — or name) of this sandbox, running once
        returned; each with its own ``env`` and ``labels`` (loam's
        ``fork(id, name=…, labels=…)``), never the source's. Without ``count``: one Sandbox
        (named ``name``; ``POST /v1/sandboxes`` with ``from``, idempotent).
        With ``count``: a ForkList of up to ``count`` (1–100), named
        ``<name>-1`` … when ``name`` is given (``POST …/fork``, idempotent:
        a retry never makes a fork twice); the forks are waited for together. When one of them does not come to
        ``running`` (or the single fork does not), StrataError: its
        ``data`` has ``ids``, every fork made (``id`` for a single fork),
        so the caller can kill them. ``access``: each fork's access setting
        (see ``set_access``; default, never the source's). ``network``:
        each fork's network setting (default: the source's)."""
        if count is None:
            body: dict[str, Any] = {"from": {"sandbox": self.id, "snapshot": snapshot}}
            for k, v in (("name", name), ("access", access), ("env", env), ("labels", labels), ("network", network)):
                if v is not None:
                    body[k] = v
            return self._create(body, wait, timeout, self.client)
        req: dict[str, Any] = {"count": count}
        for k, v in (("name_prefix", name), ("access", access), ("env", env), ("labels", labels), ("network", network)):
            if v is not None:
                req[k] = v
        resp = self.client.request("POST", self._path("snapshots", snapshot, "fork"), body=req, idempotent=True, timeout=timeout)
        forks = ForkList([Sandbox(r["id"], client=self.client, info=r) for r in resp.data.get("sandboxes") or []], list(resp.data.get("failed") or []))
        if wait and forks:
            _wait_forks(forks, timeout)
        return forks

    # -- the seeds' names for VM snapshots ----------------------------------

    def create_checkpoint(
        self,
        name: str | None = None,
        *,
        comment: str | None = None,
        memory: bool | None = None,
        retention: Retention | None = None,
        kind: str | None = None,
        retention_policy: Retention | None = None,
    ) -> Record:
        """The seeds' ``create_checkpoint("after-build")``: a **VM snapshot**
        (``sb.snapshots.create(name=…)``), not a directory checkpoint,
        returned as OpenComputer's CheckpointInfo (``checkpoint_info``: a
        dict whose ``id`` is the snapshot's ref), once ``ready``.
        OpenComputer's options ``kind="disk_only"`` and
        ``retention_policy={"mode": "delete_oldest", "maxCount": 100}``, and
        loam's ``comment=``, are taken."""
        return checkpoint_info(
            self.snapshots.create(name=name, comment=comment, memory=memory, retention=retention, kind=kind, retention_policy=retention_policy)
        )

    def list_checkpoints(self) -> list[Record]:
        """The seeds' ``list_checkpoints()``: the VM snapshots, oldest
        first, as CheckpointInfo dicts (see ``create_checkpoint``)."""
        return [checkpoint_info(s) for s in self.snapshots.list()]

    def restore_checkpoint(self, id: str | dict[str, Any], *, disk_only: bool = False) -> Record:
        """The seeds' name for ``sb.snapshots.restore(id)`` (VM snapshot):
        ``id`` a checkpoint's ``id`` (its ref), a ``v1``-style id or a name,
        or the checkpoint dict itself; returns once the sandbox runs again."""
        return self.snapshots.restore(_snapshot_key(id), disk_only=disk_only)

    def delete_checkpoint(self, id: str | dict[str, Any]) -> None:
        """The seeds' name for ``sb.snapshots.delete(id)`` (VM snapshot);
        ``id`` as ``restore_checkpoint``'s."""
        self.snapshots.delete(_snapshot_key(id))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        """Leaving a ``with Sandbox.create() as sb:`` block kills the sandbox."""
        try:
            self.kill()
        except StrataError as e:
            if e.code != "sandbox_not_found":
                raise


def _wait_forks(forks: ForkList, timeout: float) -> None:
    """Wait for every fork at once (a thread each); when any fails, a
    StrataError naming every fork made (``data["ids"]``) and each failure
    (``data["errors"]``: id → ``{"code","message"}``)."""
    errors: dict[str, BaseException] = {}
    lock = threading.Lock()

    def one(f: Sandbox) -> None:
        try:
            f._wait(Response(202, {}, f.info), "running", timeout)
        except BaseException as e:  # reported below
            with lock:
                errors[f.id] = e

    threads = [threading.Thread(target=one, args=(f,), name=f"strata-fork-{f.id}", daemon=True) for f in forks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not errors:
        return
    first = next(errors[f.id] for f in forks if f.id in errors)
    detail = {
        sid: ({"code": e.code, "message": e.message} if isinstance(e, StrataError) else {"code": "unknown", "message": repr(e)})
        for sid, e in errors.items()
    }
    ids = [f.id for f in forks]
    code = first.code if isinstance(first, StrataError) else "unknown"
    status = first.status if isinstance(first, StrataError) else 0
    raise StrataError(
        code,
        f"{len(errors)} of {len(forks)} forks did not come to running ({first}); "
        f"every fork made is in data['ids']: kill them when done",
        status,
        {"ids": ids, "errors": detail, "failed": list(forks.failed)},
    )


def _snapshot_key(id: str | dict[str, Any]) -> str:
    """A snapshot named by a string, or by its checkpoint or snapshot dict
    (its ref when it has one)."""
    if isinstance(id, dict):
        return str(id.get("ref") or id.get("id"))
    return id


def _poll_after(resp: Response) -> float | None:
    v = resp.header("X-Poll-After")
    try:
        return float(v) if v else None
    except ValueError:
        return None
