"""The HTTP layer: one configured client (``Strata``), JSend answers, retries.

Requests use ``http.client`` (one connection per call: no third-party HTTP
library is needed, and the package imports on any Python 3.11).

Retries follow the one rule of the three clients (docs/sdk.md, "Retries"):
GET, HEAD, PUT (a body held whole: a file, the access setting) and the POSTs
that carry an ``Idempotency-Key`` (sandbox create and fork, the many-forks
fork, directory checkpoint create and restore) are sent again, with the same
key, after a network error (a timeout included) or a 500, 502, 503 (but
``host_capacity``: the host is full, and a retry would only hide it) or 504.
Any call whose body can be sent again is, after a 429 (refused at the edge)
or a refused connection: it certainly did nothing. Nothing else is: a DELETE
or another POST may have been done. Each wait is the answer's
``Retry-After``, or 0.25 s doubling to 5 s, drawn between half and one and a
half times that; a wait that would end more than ``retry_for`` seconds
after the call's first failure is not waited, and the failure is raised
(``retry_for=0``: no retries).

Codes of the errors the SDK makes itself (the others are the API's):
``network_error`` (no answer came), ``http_<status>`` (an answer that is not
JSend), ``wait_timeout``, ``attachment_closed``, ``invalid_argument``; see
``StrataError``.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import random
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

from . import _config
from ._errors import StrataError
from ._records import to_record

__version__ = "0.1.0"

USER_AGENT = f"strata-python/{__version__}"
RETRY_STATUSES = frozenset({500, 502, 503, 504})  # and 429 for any call: see the module docstring
DEFAULT_TIMEOUT = 120.0

T = TypeVar("T")

def quote(segment: str) -> str:
    """One path segment, percent-encoded (``/`` included)."""
    return urllib.parse.quote(segment, safe="")


def quote_path(path: str) -> str:
    """A slash-separated path, each segment percent-encoded, without leading
    or trailing slashes."""
    return "/".join(quote(s) for s in path.strip("/").split("/") if s != "")


@dataclass
class Response:
    """One JSend answer: the HTTP status, headers and decoded ``data``."""

    status: int
    headers: dict[str, str]
    data: Any = None
    request_id: str | None = None
    raw: bytes = field(default=b"", repr=False)

    def header(self, name: str) -> str | None:
        """A header of the answer, by case-insensitive name."""
        return self.headers.get(name.lower())


def _headers_of(resp: http.client.HTTPResponse) -> dict[str, str]:
    return {k.lower(): v for k, v in resp.getheaders()}


def error_from(status: int, headers: dict[str, str], raw: bytes, method: str = "", path: str = "") -> StrataError:
    """The StrataError of a non-success answer (a JSend fail or error, or
    anything else)."""
    request_id = headers.get("x-request-id")
    try:
        env = json.loads(raw) if raw else None
    except ValueError:
        env = None
    if isinstance(env, dict) and env.get("status") == "fail" and isinstance(env.get("data"), dict):
        data = dict(env["data"])
        code = str(data.pop("code", "") or "unknown")
        message = str(data.pop("message", "") or f"HTTP {status}")
        return StrataError(code, message, status, to_record(data), request_id)
    if isinstance(env, dict) and env.get("status") == "error":
        data = env.get("data") if isinstance(env.get("data"), dict) else {}
        data = dict(data or {})
        code = str(data.pop("code", "") or "server_error")
        return StrataError(code, str(env.get("message") or f"HTTP {status}"), status, to_record(data), request_id)
    # No JSend body: a HEAD's refusal, or something in front of the API.
    code = f"http_{status}"
    text = raw[:200].decode("utf-8", "replace").strip()
    what = f"{method} {path}: " if method else ""
    return StrataError(code, f"{what}HTTP {status}" + (f": {text}" if text else ""), status, {}, request_id)


def _retry_after(headers: dict[str, str]) -> float | None:
    v = headers.get("retry-after")
    if not v:
        return None
    try:
        return max(0.0, float(v))
    except (TypeError, ValueError):
        pass
    try:
        when = email.utils.parsedate_to_datetime(v)
        return max(0.0, when.timestamp() - time.time()) if when else None
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None  # not a number of seconds nor an HTTP date: ignored


class Strata:
    """A configured client of the strata API: its address and key.

    ``Strata(api_url=…, api_key=…)``; an argument left out comes from
    ``CREATEOS_API_URL`` / ``CREATEOS_API_KEY`` in the environment, and inside
    a sandbox from ``/run/strata/credentials.env`` for any variable the
    environment lacks. ``sandbox_id`` (default ``CREATEOS_SANDBOX_ID``, same
    sources) is what ``Sandbox.connect()`` without an id connects to.

    ``timeout`` bounds each call that answers at once (exec and the waits
    have their own); ``retry_for`` bounds how long a call is retried (see the
    module's docstring). ``on_request(method, path)`` is called before every
    HTTP request and WebSocket attachment this client sends (its path
    without the query), for logs and tests; the SDK keeps no list of calls.
    Pass the client to the SDK's entry points as ``client=…``, or use its
    shortcuts ``create``, ``connect`` and ``list``.
    """

    api_url: str
    api_key: str
    sandbox_id: str | None
    timeout: float
    retry_for: float

    def __init__(
        self,
        api_url: str | None = None,
        api_key: str | None = None,
        *,
        sandbox_id: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry_for: float = 60.0,
        credentials_file: str | None = None,
        on_request: Callable[[str, str], None] | None = None,
    ) -> None:
        url = api_url or _config.lookup(_config.ENV_API_URL, credentials_file)
        key = api_key or _config.lookup(_config.ENV_API_KEY, credentials_file)
        where = credentials_file or _config.credentials_file()
        if not url:
            raise StrataError("not_configured", f"no API address: pass api_url or set {_config.ENV_API_URL} ({where} has none either)")
        if not key:
            raise StrataError("not_configured", f"no API key: pass api_key or set {_config.ENV_API_KEY} ({where} has none either)")
        self.api_url = url.rstrip("/")
        self.api_key = key
        self.sandbox_id = sandbox_id or _config.lookup(_config.ENV_SANDBOX_ID, credentials_file)
        self.timeout = timeout
        self.retry_for = retry_for
        self._on_request = on_request
        u = urllib.parse.urlsplit(self.api_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise StrataError("not_configured", f"the API address must be http:// or https://, not {self.api_url!r}")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._prefix = u.path.rstrip("/")
        self._ssl = ssl.create_default_context() if u.scheme == "https" else None

    def __repr__(self) -> str:
        return f"Strata(api_url={self.api_url!r}, api_key='…{self.api_key[-4:]}')"

    # -- shortcuts --------------------------------------------------------

    def create(self, **kwargs: Any) -> Any:
        """``Sandbox.create(…, client=self)``."""
        from .sandbox import Sandbox

        return Sandbox.create(client=self, **kwargs)

    def connect(self, id: str | None = None) -> Any:
        """``Sandbox.connect(id, client=self)``."""
        from .sandbox import Sandbox

        return Sandbox.connect(id, client=self)

    def list(self) -> Any:
        """``Sandbox.list(client=self)``."""
        from .sandbox import Sandbox

        return Sandbox.list(client=self)

    # -- transport --------------------------------------------------------

    def connection(self, timeout: float | None) -> http.client.HTTPConnection:
        """A new HTTP connection to the API (the caller closes it)."""
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def url_path(self, path: str, query: dict[str, Any] | None = None) -> str:
        """The request target of an API path (``/v1/…``) and its query."""
        target = self._prefix + path
        if query:
            # A list's values are each sent (label=a=1&label=b=2).
            pairs = [
                (k, x if isinstance(v, list) else ("true" if v is True else "false" if v is False else str(v)))
                for k, v in query.items()
                if v is not None
                for x in (v if isinstance(v, list) else [v])
            ]
            if pairs:
                target += "?" + urllib.parse.urlencode(pairs)
        return target

    def notify(self, method: str, path: str) -> None:
        """Tell the ``on_request`` hook, if any, of a request about to be sent."""
        if self._on_request is not None:
            self._on_request(method, path)

    def base_headers(self) -> dict[str, str]:
        """The headers of every call: the key and the user agent."""
        return {"X-Api-Key": self.api_key, "User-Agent": USER_AGENT}

    def _with_retries(self, attempt: Callable[[], T], retry: bool, what: str) -> T:
        """Run attempt() until it returns; retry as the module docstring says.
        attempt raises _Retry(delay, err) for a retryable outcome. The budget
        (``retry_for``) counts from the first failure, not from the first
        attempt: an attempt may take up to the call's timeout (longer than
        the budget by default), and a call that ran into it is still sent
        once more."""
        deadline: float | None = None
        backoff = 0.25
        while True:
            try:
                return attempt()
            except _Retry as r:
                safe = retry or r.never_done
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.retry_for
                delay = r.delay if r.delay is not None else backoff * (0.5 + random.random())
                if not safe or now + delay > deadline:
                    raise r.error from None
                backoff = min(backoff * 2, 5.0)
                time.sleep(delay)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
        idempotent: bool = False,
        timeout: float | None = None,
    ) -> Response:
        """Send one JSON call and return its answer (``data`` decoded into
        Records); a failure raises StrataError. ``idempotent`` POSTs get an
        ``Idempotency-Key`` (uuid4, the same on every retry) and are retried
        as GETs are (see the module docstring)."""
        h = self.base_headers()
        h["Accept"] = "application/json"
        payload: bytes | None = None
        if body is not None:
            payload = json.dumps(body, separators=(",", ":")).encode()
            h["Content-Type"] = "application/json"
        if idempotent:
            h["Idempotency-Key"] = str(uuid.uuid4())
        if headers:
            h.update(headers)
        if payload is None and method in ("POST", "PUT"):
            h["Content-Length"] = "0"
        target = self.url_path(path, query)
        retry = idempotent or method in ("GET", "HEAD", "PUT")
        t = self.timeout if timeout is None else timeout

        def attempt() -> Response:
            self.notify(method, path)
            conn = self.connection(t)
            try:
                try:
                    conn.request(method, target, body=payload, headers=h)
                    resp = conn.getresponse()
                    raw = resp.read()
                except ConnectionRefusedError as e:
                    raise _Retry(None, StrataError("network_error", f"{method} {path}: {e}"), never_done=True) from None
                except (OSError, http.client.HTTPException) as e:
                    raise _Retry(None, StrataError("network_error", f"{method} {path}: {e!r}")) from None
            finally:
                conn.close()
            hdrs = _headers_of(resp)
            if resp.status in (200, 201, 202, 204):
                data = None
                if raw:
                    try:
                        env = json.loads(raw)
                    except ValueError:
                        raise StrataError(f"http_{resp.status}", f"{method} {path}: HTTP {resp.status} with a body that is not JSON", resp.status, {}, hdrs.get("x-request-id")) from None
                    data = to_record(env.get("data")) if isinstance(env, dict) else env
                return Response(resp.status, hdrs, data, hdrs.get("x-request-id"), raw)
            err = error_from(resp.status, hdrs, raw, method, path)
            if resp.status == 429 or _retried(resp.status, err):
                raise _Retry(_retry_after(hdrs), err, never_done=resp.status == 429)
            raise err

        return self._with_retries(attempt, retry, f"{method} {path}")

    def stream(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        body: bytes | Any = None,
        retry: bool = False,
        timeout: float | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send a request whose body or answer streams (the files routes):
        the open connection and answer on success (the caller reads and
        closes both), StrataError otherwise. A body that is not bytes (a file
        object or an iterable of bytes) is sent with chunked encoding and is
        never retried."""
        h = self.base_headers()
        if headers:
            h.update(headers)
        target = self.url_path(path, query)
        chunked = body is not None and not isinstance(body, (bytes, bytearray, memoryview))
        if body is None and method in ("PUT", "POST"):
            h["Content-Length"] = "0"
        t = self.timeout if timeout is None else timeout

        def attempt() -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
            self.notify(method, path)
            conn = self.connection(t)
            try:
                conn.request(method, target, body=body, headers=h, encode_chunked=chunked)
                resp = conn.getresponse()
            except ConnectionRefusedError as e:
                conn.close()
                raise _Retry(None, StrataError("network_error", f"{method} {path}: {e}"), never_done=not chunked) from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise _Retry(None, StrataError("network_error", f"{method} {path}: {e!r}")) from None
            except BaseException:
                conn.close()
                raise
            if resp.status < 300 or resp.status == 304:
                return conn, resp
            hdrs = _headers_of(resp)
            raw = b"" if method == "HEAD" else resp.read(1 << 20)
            conn.close()
            err = error_from(resp.status, hdrs, raw, method, path)
            if method == "HEAD" and resp.status in (404, 409):
                # A HEAD's refusal has no body to carry the code: the files
                # routes' own codes for these two statuses.
                err.code = "file_not_found" if resp.status == 404 else "not_a_file"
            if resp.status == 429 or _retried(resp.status, err):
                raise _Retry(_retry_after(hdrs), err, never_done=resp.status == 429 and not chunked)
            raise err

        return self._with_retries(attempt, retry and not chunked, f"{method} {path}")


def _retried(status: int, err: StrataError) -> bool:
    """Whether an answer is one a retryable call is sent again after."""
    return status in RETRY_STATUSES and err.code != "host_capacity"


class _Retry(Exception):
    def __init__(self, delay: float | None, error: StrataError, never_done: bool = False) -> None:
        super().__init__(str(error))
        self.delay = delay
        self.error = error
        self.never_done = never_done


_default: Strata | None = None
_default_lock = threading.Lock()


def configure(api_url: str | None = None, api_key: str | None = None, **kwargs: Any) -> Strata:
    """Set the module-level default client (what ``Sandbox.create()`` and the
    others use without ``client=``) and return it."""
    global _default
    with _default_lock:
        _default = Strata(api_url, api_key, **kwargs)
        return _default


def default_client() -> Strata:
    """The module-level default client, made from the environment (and the
    credentials file inside a sandbox) at its first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Strata()
        return _default


def resolve(client: Strata | None) -> Strata:
    """client, or the default one."""
    return client if client is not None else default_client()


def socket_error_types() -> tuple[type[BaseException], ...]:
    """The exceptions a broken connection raises."""
    return (OSError, socket.timeout, http.client.HTTPException)


def chunks_of(data: Iterable[bytes]) -> Iterable[bytes]:
    """Skip empty chunks (a zero-length chunk would end a chunked body)."""
    for c in data:
        if c:
            yield bytes(c)
