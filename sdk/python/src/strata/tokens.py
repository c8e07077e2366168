"""The sandbox access token (``sb.access_token``): a key that acts only on
its one sandbox, within its scopes (``checkpoints`` and ``snapshots``
unless its issue names others: ``exec``, ``files``, ``ports``,
``watch``). Managing it needs the account key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

from ._client import quote
from ._records import Record

if TYPE_CHECKING:
    from .sandbox import Sandbox

#: The scopes a token or a channel key may have.
SCOPES = ("checkpoints", "snapshots", "exec", "files", "ports", "watch")

#: A sandbox's access setting: ``"none"`` (its guest is handed no key), or
#: ``{"scopes": [...]}`` (what the key it is handed may do).
Access = Union[str, Mapping[str, Sequence[str]]]


class AccessToken:
    """``sb.access_token``: issue, show, rotate and revoke the sandbox's token."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _path(self, *rest: str) -> str:
        return f"/v1/sandboxes/{quote(self._sb.id)}/access-token" + "".join("/" + r for r in rest)

    def issue(self, *, scopes: Sequence[str] | None = None) -> Record:
        """Issue a token: ``{"token","hint","created_at","scopes"}``, the
        only time the token is shown (``409 token_exists`` when one is
        enabled). ``scopes``: what it may do (default ``checkpoints`` and
        ``snapshots``); an unknown one, or ``exec``/``files`` on a
        configured sandbox, is ``400 invalid_field``."""
        body: Any = None if scopes is None else {"scopes": list(scopes)}
        return self._sb.client.request("POST", self._path(), body=body).data  # type: ignore[no-any-return]

    def get(self) -> Record:
        """``{"enabled","hint"?,"created_at"?,"scopes"?}``, never the token."""
        return self._sb.client.request("GET", self._path()).data  # type: ignore[no-any-return]

    def rotate(self) -> Record:
        """A new token, with the old one's scopes, replaces it at once
        (``404 token_not_found`` when none)."""
        return self._sb.client.request("POST", self._path("rotate")).data  # type: ignore[no-any-return]

    def revoke(self) -> None:
        """Revoke the token (succeeds when there is none)."""
        self._sb.client.request("DELETE", self._path())
