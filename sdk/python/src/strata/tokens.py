"""The sandbox access token (``sb.access_token``): a key that acts only on
its one sandbox. Managing it needs the account key."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._client import quote
from ._records import Record

if TYPE_CHECKING:
    from .sandbox import Sandbox


class AccessToken:
    """``sb.access_token``: issue, show, rotate and revoke the sandbox's token."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _path(self, *rest: str) -> str:
        return f"/v1/sandboxes/{quote(self._sb.id)}/access-token" + "".join("/" + r for r in rest)

    def issue(self) -> Record:
        """Issue a token: ``{"token","hint","created_at"}``, the only time
        the token is shown (``409 token_exists`` when one is enabled)."""
        return self._sb.client.request("POST", self._path()).data  # type: ignore[no-any-return]

    def get(self) -> Record:
        """``{"enabled","hint"?,"created_at"?}``, never the token."""
        return self._sb.client.request("GET", self._path()).data  # type: ignore[no-any-return]

    def rotate(self) -> Record:
        """A new token replaces the old at once (``404 token_not_found`` when none)."""
        return self._sb.client.request("POST", self._path("rotate")).data  # type: ignore[no-any-return]

    def revoke(self) -> None:
        """Revoke the token (succeeds when there is none)."""
        self._sb.client.request("DELETE", self._path())
