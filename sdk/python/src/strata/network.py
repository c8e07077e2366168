"""A sandbox's network (``sb.network``): where its guest may reach,
enforced on the host. ``egress`` is ``"all"`` (the public internet; never
private, loopback or link-local addresses nor the host's own, unless the
deployment lists them), ``"none"``, or ``"list"`` (only what ``allow``
names: host names, ``*.`` wildcards, CIDRs); ``deny`` wins over
``allow``. Names are checked at DNS and at connect (TLS SNI, HTTP Host); a
refused connection fails at once. Reading and changing it needs the
account key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ._records import Record

if TYPE_CHECKING:
    from .sandbox import Sandbox

#: A network setting: ``{"egress": "all"|"none"|"list", "allow": [...], "deny": [...]}``.
NetworkSetting = Mapping[str, Any]


class Network:
    """``sb.network``: the sandbox's network setting and its usage."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def get(self) -> Record:
        """``{"egress","allow"?,"deny"?,"usage"?}``: the setting in its
        canonical form, and while the sandbox runs its ``usage``
        (``bytes_out``, ``bytes_in``, ``connections``, ``refused`` since
        its machine last started)."""
        return self._sb.client.request("GET", self._sb._path("network")).data  # type: ignore[no-any-return]

    def set(self, egress: str = "all", *, allow: Sequence[str] | None = None, deny: Sequence[str] | None = None) -> Record:
        """Replace the setting, at once for new connections and DNS
        questions (open connections keep theirs); returns it as ``get``
        does. A broken rule is ``400 invalid_field`` naming
        ``network.egress``, ``network.allow`` or ``network.deny`` and its
        index."""
        return self._sb.client.request("PUT", self._sb._path("network"), body=setting(egress, allow, deny)).data  # type: ignore[no-any-return]


def setting(egress: str, allow: Sequence[str] | None, deny: Sequence[str] | None) -> dict[str, Any]:
    """The body of a network setting."""
    body: dict[str, Any] = {"egress": egress}
    if allow is not None:
        body["allow"] = list(allow)
    if deny is not None:
        body["deny"] = list(deny)
    return body
