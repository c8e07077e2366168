"""The one error class of the SDK."""

from __future__ import annotations

from typing import Any


class StrataError(Exception):
    """An API call that failed, or a transport failure around one.

    Attributes:
        code: the API's stable code (``"sandbox_not_found"``, ``"directory_busy"``,
            ``"invalid_field"`` …); for a server error (5xx) the classified code
            the server gave (``"guest_timeout"``, ``"insufficient_storage"``) or
            ``"server_error"``. The SDK's own codes: ``"network_error"`` when
            no answer came (refused, reset, TLS, timed out; status 0),
            ``"http_<status>"`` for an answer that is not JSend (e.g.
            ``"http_502"`` from a proxy), ``"wait_timeout"`` when a wait for a
            state ran out, ``"attachment_closed"`` when a session's attachment
            broke and could not be opened again, ``"invalid_argument"`` for a
            bad argument caught before any request; and
            ``"not_configured"``, ``"sandbox_error"`` (a sandbox ended in
            state ``error``), ``"sandbox_state"``, ``"not_a_file"``,
            ``"not_a_directory"``, ``"file_not_found"`` (a HEAD's 404),
            ``"upload_failed"``, ``"download_failed"``.
        message: one human sentence.
        status: the HTTP status (0 when there was no answer).
        data: the other fields of the answer (``path``, ``holders``, ``limit``,
            ``state`` …), a dict (empty when none).
        request_id: the ``X-Request-Id`` header of the answer, to quote when
            reporting a problem (``None`` when there was no answer).
    """

    code: str
    message: str
    status: int
    data: dict[str, Any]
    request_id: str | None

    def __init__(
        self,
        code: str,
        message: str,
        status: int = 0,
        data: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.status = status
        self.data = dict(data or {})
        self.request_id = request_id
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"{self.status} {self.code}" if self.status else self.code
        tail = f" (request {self.request_id})" if self.request_id else ""
        return f"{head}: {self.message}{tail}"

    def __repr__(self) -> str:
        return (
            f"StrataError(code={self.code!r}, message={self.message!r}, status={self.status!r}, "
            f"data={self.data!r}, request_id={self.request_id!r})"
        )
