"""Checks that need no stack: the route table against openapi.json, the
reference docs, the build backend, the credentials file, WebSocket framing."""

from __future__ import annotations

import hashlib
import base64
import csv
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import strata
from strata import _config, _routes, _websocket
from conftest import OPENAPI, SDK


def openapi_routes() -> set[tuple[str, str]]:
    doc = json.loads(OPENAPI.read_text())
    return {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops if m in ("get", "post", "put", "delete", "head", "patch")}


def test_every_route_is_reached_by_a_method() -> None:
    """One description, three clients: each route of openapi.json (but the
    three non-SDK ones) is called by some SDK method."""
    missing = openapi_routes() - _routes.all_routes() - _routes.NON_SDK_ROUTES
    assert not missing, f"routes no SDK method reaches: {sorted(missing)}"


def test_every_route_of_the_table_exists() -> None:
    unknown = _routes.all_routes() - openapi_routes()
    assert not unknown, f"the table names routes openapi.json lacks: {sorted(unknown)}"
    assert _routes.NON_SDK_ROUTES <= openapi_routes()


def test_every_method_of_the_table_exists() -> None:
    for qualname in _routes.ROUTES:
        cls, meth = qualname.split(".")
        assert callable(getattr(getattr(strata, cls), meth)), qualname
        async_cls = getattr(strata, "Async" + cls.replace("AccessToken", "AccessToken"), None)
        if async_cls is not None:
            assert hasattr(async_cls, meth), f"Async{qualname} missing"


def test_docs_generate() -> None:
    """docs.sh: pydoc for each module, and a docstring on every public name."""
    r = subprocess.run(["sh", str(SDK / "docs.sh")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_credentials_file(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "credentials.env"
    f.write_text("CREATEOS_API_URL='http://127.0.0.1:7777'\nCREATEOS_SANDBOX_ID='sb-x'\n# c\nCREATEOS_API_KEY='sbc_abc'\n")
    monkeypatch.delenv("CREATEOS_API_URL", raising=False)
    monkeypatch.delenv("CREATEOS_API_KEY", raising=False)
    monkeypatch.delenv("CREATEOS_SANDBOX_ID", raising=False)
    monkeypatch.setenv("CREATEOS_CREDENTIALS", str(f))
    c = strata.Strata()
    assert (c.api_url, c.api_key, c.sandbox_id) == ("http://127.0.0.1:7777", "sbc_abc", "sb-x")
    assert strata.Sandbox.connect(client=c).id == "sb-x"
    monkeypatch.setenv("CREATEOS_API_KEY", "from-env")
    assert strata.Strata().api_key == "from-env"
    monkeypatch.setenv("CREATEOS_CREDENTIALS", str(tmp_path / "none"))
    monkeypatch.delenv("CREATEOS_API_KEY")
    try:
        strata.Strata()
        raise AssertionError("no key should fail")
    except strata.StrataError as e:
        assert e.code == "not_configured"


def test_websocket_mask() -> None:
    data = bytes(range(256)) * 3 + b"x"
    mask = b"\x01\x02\x03\x04"
    masked = _websocket._mask(data, mask)
    assert masked == bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    assert _websocket._mask(masked, mask) == data


def test_build_backend(tmp_path: Path) -> None:
    """The in-tree backend builds a wheel whose RECORD hashes match and whose
    METADATA names the project, and a reproducible sdist with every file of
    the package, owned by 0, timed by SOURCE_DATE_EPOCH."""
    import os
    import tarfile
    import tomllib

    project = tomllib.loads((SDK / "pyproject.toml").read_text())["project"]
    norm = project["name"].lower().replace("-", "_").replace(".", "_")
    (tmp_path / "e").mkdir()
    (tmp_path / "again").mkdir()
    code = (
        "import sys; sys.path.insert(0, '_build'); import strata_build as b;"
        f"print(b.build_wheel({str(tmp_path)!r})); print(b.build_sdist({str(tmp_path)!r}));"
        f"print(b.build_editable({str(tmp_path / 'e')!r})); print(b.build_sdist({str(tmp_path / 'again')!r}))"
    )
    env = dict(os.environ, SOURCE_DATE_EPOCH="1700000000")
    out = subprocess.run([sys.executable, "-c", code], cwd=SDK, capture_output=True, text=True, check=True, env=env).stdout.split()
    assert out[0] == f"{norm}-{project['version']}-py3-none-any.whl"
    assert out[1] == f"{norm}-{project['version']}.tar.gz"
    wheel = tmp_path / out[0]
    dist_info = f"{norm}-{project['version']}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert "strata/__init__.py" in names and "strata/py.typed" in names
        package = sorted(p.relative_to(SDK / "src").as_posix() for p in (SDK / "src" / "strata").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        assert sorted(n for n in names if n.startswith("strata/")) == package
        assert {f"{dist_info}/METADATA", f"{dist_info}/WHEEL", f"{dist_info}/RECORD"} <= set(names)
        meta = zf.read(f"{dist_info}/METADATA").decode()
        fields = dict(line.split(": ", 1) for line in meta.split("\n\n", 1)[0].splitlines())
        assert fields["Name"] == project["name"] and fields["Version"] == project["version"]
        assert fields["Metadata-Version"] and fields["Requires-Python"] == project["requires-python"]
        record = f"{dist_info}/RECORD"
        seen = set()
        for path, digest, size in csv.reader(io.StringIO(zf.read(record).decode())):
            seen.add(path)
            if path == record:
                continue
            data = zf.read(path)
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == want and int(size) == len(data), path
        assert seen == set(names), "RECORD lists every file of the wheel"
    sdist = tmp_path / out[1]
    assert sdist.read_bytes() == (tmp_path / "again" / out[3]).read_bytes(), "the sdist is reproducible"
    base = f"{norm}-{project['version']}"
    with tarfile.open(sdist) as tf:
        members = tf.getmembers()
        got = {m.name for m in members}
        want = {f"{base}/PKG-INFO", f"{base}/pyproject.toml", f"{base}/README.md", f"{base}/docs.sh", f"{base}/_build/strata_build.py"}
        want |= {f"{base}/src/{p}" for p in package}
        want |= {f"{base}/tests/{p.name}" for p in (SDK / "tests").glob("*.py")}
        assert want <= got, sorted(want - got)
        assert all(m.name.startswith(base + "/") and "__pycache__" not in m.name for m in members)
        for m in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (1700000000, 0, 0, "", ""), m.name
        pkg_info = tf.extractfile(f"{base}/PKG-INFO").read().decode()  # type: ignore[union-attr]
        assert f"Name: {project['name']}\n" in pkg_info and f"Version: {project['version']}\n" in pkg_info
        assert tf.extractfile(f"{base}/src/strata/__init__.py").read() == (SDK / "src" / "strata" / "__init__.py").read_bytes()  # type: ignore[union-attr]
    with zipfile.ZipFile(tmp_path / "e" / out[2]) as zf:
        assert any(n.endswith(".pth") for n in zf.namelist())


def test_build_backend_normalizes_names(tmp_path: Path) -> None:
    """PEP 503/427: a name like My.Strata-SDK is my_strata_sdk in file names."""
    sys.path.insert(0, str(SDK / "_build"))
    try:
        import strata_build

        assert strata_build._file_name("My.Strata-SDK") == "my_strata_sdk"
        assert strata_build._file_name("a__b--c") == "a_b_c"
    finally:
        sys.path.remove(str(SDK / "_build"))


# -- errors the SDK makes, without a stack -----------------------------------


def test_retry_after_garbage() -> None:
    from strata._client import _retry_after

    assert _retry_after({"retry-after": "3"}) == 3.0
    assert _retry_after({"retry-after": "soon"}) is None
    assert _retry_after({"retry-after": "Mon, 99 Foo 2024 99:99:99 GMT"}) is None
    assert _retry_after({}) is None


def test_not_jsend_is_http_status() -> None:
    from strata._client import error_from

    e = error_from(502, {}, b"<html>bad gateway</html>", "GET", "/v1/x")
    assert (e.code, e.status) == ("http_502", 502)
    assert error_from(401, {}, b"", "HEAD", "/v1/x").code == "http_401"


def test_stdin_must_be_text() -> None:
    from strata.exec import _stdin_text

    assert _stdin_text(b"caf\xc3\xa9") == "café"
    for bad in (b"\xff\xfe", "\udc80", b"x" * ((1 << 20) + 1), 12):
        try:
            _stdin_text(bad)  # type: ignore[arg-type]
            raise AssertionError(f"{bad!r} should be refused")
        except strata.StrataError as e:
            assert e.code == "invalid_argument" and e.data["field"] == "stdin"


def test_flush_keeps_only_unsent() -> None:
    """A flush that fails at message i keeps messages i… (none is sent twice)."""
    from strata import exec as ex

    sent: list[bytes] = []

    class WS:
        def send_binary(self, data: bytes) -> None:
            if data == b"c":
                raise _websocket.WebSocketClosed(1006)
            sent.append(data)

        def send_text(self, text: str) -> None:
            self.send_binary(text.encode())

    s = ex.Session.__new__(ex.Session)
    s._lock = __import__("threading").Lock()
    s._closing = False
    s._pending = [(_websocket.OP_BINARY, b"a"), (_websocket.OP_BINARY, b"b"), (_websocket.OP_BINARY, b"c"), (_websocket.OP_TEXT, b"d")]
    assert s._flush(WS())  # type: ignore[arg-type]
    assert sent == [b"a", b"b"]
    assert s._pending == [(_websocket.OP_BINARY, b"c"), (_websocket.OP_TEXT, b"d")]


# -- the WebSocket client against a local server -----------------------------


def _serve_once(answer) -> tuple[str, dict]:
    """A one-connection TCP server on 127.0.0.1: answer(conn, request) runs
    on the connection; returns its ws:// URL and what it saw."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    seen: dict = {}

    def run() -> None:
        conn, _ = srv.accept()
        srv.close()
        with conn:
            conn.settimeout(10)
            req = b""
            while b"\r\n\r\n" not in req:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                req += chunk
            seen["request"] = req.decode("latin-1")
            try:
                answer(conn, seen["request"], seen)
            except OSError:
                pass

    threading.Thread(target=run, daemon=True).start()
    return f"ws://127.0.0.1:{srv.getsockname()[1]}/x", seen


def _accept_key(request: str) -> str:
    key = next(line.split(":", 1)[1].strip() for line in request.split("\r\n") if line.lower().startswith("sec-websocket-key:"))
    return base64.b64encode(hashlib.sha1((key + _websocket.GUID).encode()).digest()).decode()


def _upgrade(conn, request: str, connection: str = "Upgrade") -> None:
    conn.sendall(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            f"Connection: {connection}\r\nSec-WebSocket-Accept: {_accept_key(request)}\r\n"
            "Sec-WebSocket-Protocol: strata.v1\r\n\r\n"
        ).encode()
    )


def test_websocket_refusal_bodies() -> None:
    """A refusal keeps its JSend code whether its body has a length, is
    chunked, or has a Content-Length that makes no sense."""
    jsend = json.dumps({"status": "fail", "data": {"code": "sandbox_not_running", "message": "paused", "state": "paused"}}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(jsend[i : i + 7]), jsend[i : i + 7]) for i in range(0, len(jsend), 7)) + b"0\r\n\r\n"
    answers = [
        b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(jsend), jsend),
        b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        b"HTTP/1.1 409 Conflict\r\nContent-Length: nonsense\r\nConnection: close\r\n\r\n" + jsend,
    ]
    for raw in answers:
        url, _ = _serve_once(lambda conn, req, seen, raw=raw: conn.sendall(raw))
        try:
            _websocket.WebSocket.connect(url, timeout=5)
            raise AssertionError("a refusal should raise")
        except strata.StrataError as e:
            assert (e.status, e.code, e.data.get("state")) == (409, "sandbox_not_running", "paused"), repr(e)
    # A huge length is not read whole: the error comes of what there is.
    url, _ = _serve_once(lambda conn, req, seen: (conn.sendall(b"HTTP/1.1 503 x\r\nContent-Length: 99999999999\r\n\r\n" + b"y" * 100), conn.shutdown(1)))
    try:
        _websocket.WebSocket.connect(url, timeout=5)
        raise AssertionError("a refusal should raise")
    except strata.StrataError as e:
        assert (e.status, e.code) == (503, "http_503")


def test_websocket_handshake_failures_are_network_errors() -> None:
    import socket
    import struct

    def reset(conn, req, seen) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    for answer in (
        reset,
        lambda conn, req, seen: _upgrade(conn, req, connection="keep-alive"),  # no Connection: Upgrade
        lambda conn, req, seen: conn.sendall(b"garbage\r\n\r\n"),
    ):
        url, _ = _serve_once(answer)
        try:
            _websocket.WebSocket.connect(url, timeout=5)
            raise AssertionError("should fail")
        except strata.StrataError as e:
            assert (e.code, e.status) == ("network_error", 0), repr(e)
    # a handshake that times out
    url, _ = _serve_once(lambda conn, req, seen: __import__("time").sleep(3))
    try:
        _websocket.WebSocket.connect(url, timeout=0.5)
        raise AssertionError("should time out")
    except strata.StrataError as e:
        assert e.code == "network_error"


def test_websocket_frames_from_the_server() -> None:
    """Masked server frames and 1-byte close payloads are protocol errors;
    a close with no status is answered with 1000; a ping after our close
    gets no pong and no error."""
    import struct

    def frames(*raw: bytes):
        def answer(conn, req, seen) -> None:
            _upgrade(conn, req)
            for r in raw:
                conn.sendall(r)
            got = b""
            try:
                while True:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    got += chunk
            except OSError:
                pass
            seen["got"] = got

        return answer

    def close_code_sent(got: bytes) -> int | None:
        # the client's frames: find its close (opcode 8), unmask its payload
        i = 0
        while i + 6 <= len(got):
            op, n = got[i] & 0x0F, got[i + 1] & 0x7F
            mask = got[i + 2 : i + 6]
            payload = _websocket._mask(got[i + 6 : i + 6 + n], mask)
            if op == 8:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
            i += 6 + n
        return None

    cases = [
        (b"\x82\x83abcd" + _websocket._mask(b"\x01hi", b"abcd"), 1002),  # masked binary frame
        (b"\x88\x01\x03", 1002),  # a close with a 1-byte payload
        (b"\x88\x00", 1005),  # a close with no status
    ]
    for raw, want in cases:
        url, seen = _serve_once(frames(raw))
        ws = _websocket.WebSocket.connect(url, timeout=5)
        assert "Host: 127.0.0.1:" in seen["request"]
        try:
            ws.recv()
            raise AssertionError("recv should raise")
        except _websocket.WebSocketClosed as c:
            assert c.code == want
        ws.shutdown()
        for _ in range(50):
            if "got" in seen:
                break
            __import__("time").sleep(0.05)
        assert close_code_sent(seen.get("got", b"")) == (1000 if want == 1005 else want)
    # a ping after our close: skipped, then the server's close is read
    url, seen = _serve_once(frames())
    ws = _websocket.WebSocket.connect(url, timeout=5)
    ws.close(1000)
    ws._buf += b"\x89\x02hi\x88\x02\x03\xe8"
    try:
        ws.recv()
        raise AssertionError("recv should raise")
    except _websocket.WebSocketClosed as c:
        assert c.code == 1000
    ws.shutdown()
    # 1006 is never sent
    url, seen = _serve_once(frames())
    ws = _websocket.WebSocket.connect(url, timeout=5)
    ws.close(1006)
    ws.shutdown()
    for _ in range(50):
        if "got" in seen:
            break
        __import__("time").sleep(0.05)
    assert close_code_sent(seen.get("got", b"")) == 1000


def test_websocket_ipv6_host_header() -> None:
    import socket

    try:
        srv = socket.socket(socket.AF_INET6)
        srv.bind(("::1", 0))
    except OSError:
        import pytest

        pytest.skip("no IPv6 loopback")
    srv.listen(1)
    port = srv.getsockname()[1]
    got: dict = {}

    def run() -> None:
        conn, _ = srv.accept()
        with conn:
            got["req"] = conn.recv(4096).decode("latin-1")
            conn.sendall(b"HTTP/1.1 404 x\r\nContent-Length: 0\r\n\r\n")
        srv.close()

    import threading

    threading.Thread(target=run, daemon=True).start()
    try:
        _websocket.WebSocket.connect(f"ws://[::1]:{port}/x", timeout=5)
    except strata.StrataError as e:
        assert e.code == "http_404"
    assert f"Host: [::1]:{port}\r\n" in got["req"]


# Issue 30 item 6.3: this SDK retried 503 host_capacity where the TypeScript
# one did not, and they disagreed on PUT, DELETE, 501 and Retry-After. The
# rule of docs/sdk.md, "Retries", case by case: how many tries a call whose
# first answer is `first` (then a success) takes. The same table is in the
# TypeScript SDK's tests.
RETRY_CASES = [
    # (name, method, idempotent, first, code, retry_after, budget, tries)
    ("GET after 503", "GET", False, 503, None, None, 60, 2),
    ("GET after 500", "GET", False, 500, None, None, 60, 2),
    ("HEAD after 502", "HEAD", False, 502, None, None, 60, 2),
    ("GET after 504", "GET", False, 504, None, None, 60, 2),
    ("GET after a reset", "GET", False, "reset", None, None, 60, 2),
    ("PUT after 503", "PUT", False, 503, None, None, 60, 2),
    ("POST with a key after 502", "POST", True, 502, None, None, 60, 2),
    ("POST with a key after a reset", "POST", True, "reset", None, None, 60, 2),
    ("POST with a key after 503 host_capacity", "POST", True, 503, "host_capacity", None, 60, 1),
    ("GET after 507", "GET", False, 507, "insufficient_storage", None, 60, 1),
    ("GET after 501", "GET", False, 501, None, None, 60, 1),
    ("GET after 409", "GET", False, 409, "sandbox_not_running", None, 60, 1),
    ("POST without a key after 503", "POST", False, 503, None, None, 60, 1),
    ("POST without a key after a reset", "POST", False, "reset", None, None, 60, 1),
    ("DELETE after 502", "DELETE", False, 502, None, None, 60, 1),
    ("POST without a key after 429", "POST", False, 429, None, "0", 60, 2),
    ("DELETE after 429", "DELETE", False, 429, None, "0", 60, 2),
    ("GET after 503 with Retry-After 0", "GET", False, 503, None, "0", 60, 2),
    ("GET after 503 with Retry-After past the budget", "GET", False, 503, None, "3600", 60, 1),
    ("GET after 429 with Retry-After past the budget", "GET", False, 429, None, "3600", 60, 1),
    ("GET after 503, budget 0", "GET", False, 503, None, None, 0, 1),
]


def test_fork_with_count_is_idempotent() -> None:
    """Pins issue 30 item 6.4: the many-forks fork took no Idempotency-Key,
    so it could not be retried without making its forks twice. It sends one,
    and its retry the same."""
    import http.server
    import threading

    keys: list = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            keys.append(self.headers.get("Idempotency-Key"))
            if len(keys) == 1:
                status, env = 502, {"status": "error", "message": "bad gateway", "code": 502}
            else:
                rec = {"state": "creating", "memory_mib": 512, "vcpus": 1, "disk_gib": 4, "created_at": "2026-01-01T00:00:00Z"}
                status, env = 202, {"status": "success", "data": {"sandboxes": [dict(rec, id="sb-f1"), dict(rec, id="sb-f2")]}}
            out = json.dumps(env).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = strata.Strata(f"http://127.0.0.1:{srv.server_address[1]}", "k")
        forks = strata.Sandbox.connect("sb-parent", client=client).fork("v1", count=2, wait=False)
        assert [f.id for f in forks] == ["sb-f1", "sb-f2"]
        assert len(keys) == 2 and keys[0] and keys[0] == keys[1]
    finally:
        srv.shutdown()


def test_the_one_retry_rule() -> None:
    import http.server
    import socket
    import threading

    state: dict = {}

    class H(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(n)
            state["n"] += 1
            state["keys"].append(self.headers.get("Idempotency-Key"))
            _, _, first, code, retry_after = state["case"]
            if state["n"] > 1:
                out = b'{"status":"success","data":{}}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return
            if first == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.connection.close()
                return
            if first >= 500:
                env = {"status": "error", "message": "m", "code": first, "data": {"code": code} if code else None}
            else:
                env = {"status": "fail", "data": {"code": code or "rate_limited", "message": "m"}}
            out = b"" if self.command == "HEAD" else json.dumps(env).encode()
            self.send_response(first)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for name, method, idempotent, first, code, retry_after, budget, tries in RETRY_CASES:
            state.update(n=0, keys=[], case=(name, method, first, code, retry_after))
            c = strata.Strata(f"http://127.0.0.1:{srv.server_address[1]}", "k", retry_for=budget)
            try:
                c.request(method, "/v1/sandboxes/sb-x", idempotent=idempotent)
            except strata.StrataError:
                pass
            assert state["n"] == tries, name
            assert len(set(state["keys"])) == 1, f"{name}: the same key on every try"
    finally:
        srv.shutdown()


def test_session_ends_with_session_restored() -> None:
    """Pins issue 30 item 6.2: after a restore, a session's reattach went on
    in the snapshot's run (its output spliced after ours). Every attachment
    names the record's generation; a refusal of it ends the output with
    session_restored, after what the first attachment gave, and nothing
    else."""
    import socket
    import threading

    gen = "0123456789abcdef"
    targets: list[str] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def answer(conn: socket.socket) -> None:
        conn.settimeout(10)
        req = b""
        while b"\r\n\r\n" not in req:
            chunk = conn.recv(4096)
            if not chunk:
                return
            req += chunk
        head = req.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        method, target = head.split(" ")[:2]
        if method == "POST":
            n = int(next((l.split(":", 1)[1] for l in head.split("\r\n") if l.lower().startswith("content-length:")), "0"))
            body = req.split(b"\r\n\r\n", 1)[1]
            while len(body) < n:
                body += conn.recv(4096)
            rec = {"id": "se-0123456789abcdef", "cmd": ["sh"], "tty": False, "detachable": True, "state": "running",
                   "attached": 0, "created_at": "2026-01-01T00:00:00Z", "output_bytes": 0, "generation": gen}
            out = json.dumps({"status": "success", "data": rec}).encode()
            conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(out), out))
            return
        targets.append(target)
        if len(targets) == 1:
            _upgrade(conn, head)
            conn.sendall(b"\x82\x08\x01before\n")
            reason = b"the sandbox is being restored"
            conn.sendall(bytes([0x88, 2 + len(reason)]) + (1011).to_bytes(2, "big") + reason)
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                pass
            return
        out = json.dumps({"status": "fail", "data": {"code": "session_restored", "message": "restored", "generation": "fedcba9876543210"}}).encode()
        conn.sendall(b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(out), out))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                try:
                    answer(conn)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        client = strata.Strata(f"http://127.0.0.1:{srv.getsockname()[1]}", "k", retry_for=0)
        s = strata.Sandbox.connect("sb-x", client=client).exec.start(["sh"], detachable=True)
        assert s.generation == gen
        got = []
        try:
            for chunk in s:
                got.append(chunk.data)
            raise AssertionError("the output should end with session_restored")
        except strata.StrataError as e:
            assert e.code == "session_restored", repr(e)
        assert got == [b"before\n"]
        assert targets == [f"/v1/sandboxes/sb-x/sessions/se-0123456789abcdef/attach?since={n}&generation={gen}" for n in (0, 7)]
    finally:
        srv.close()


def test_calls_are_told_not_kept() -> None:
    """Pins issue 30 item 6.5: the SDK kept every call of the process in a
    module-level list (up to 100,000). Calls go to the client's on_request
    hook, and nothing of them stays in the module."""
    from strata import _client

    assert not [n for n, v in vars(_client).items() if isinstance(v, (list, set, dict)) and n.upper() == n and n != "RETRY_STATUSES"]
    seen: list[tuple[str, str]] = []
    c = strata.Strata("http://127.0.0.1:1", "k", retry_for=0, on_request=lambda m, p: seen.append((m, p)))
    try:
        strata.Sandbox.list(client=c)
        raise AssertionError("nothing listens on port 1")
    except strata.StrataError as e:
        assert e.code == "network_error"
    assert seen and set(seen) == {("GET", "/v1/sandboxes")}


def test_download_modes(tmp_path: Path) -> None:
    """Pins issue 30 item 6: a download kept the guest's modes whatever the
    umask, and as root its setuid bits and owners. Files and directories get
    the tar's permissions less the umask, never setuid, setgid or sticky, and
    this process's user."""
    import http.server
    import tarfile
    import threading

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, mode in (("open", tarfile.REGTYPE, 0o777), ("suid", tarfile.REGTYPE, 0o4755), ("tmp", tarfile.DIRTYPE, 0o1777)):
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.uid, ti.gid, ti.size = kind, mode, 4242, 4242, 1 if kind == tarfile.REGTYPE else 0
            tf.addfile(ti, io.BytesIO(b"x") if kind == tarfile.REGTYPE else None)
    body = buf.getvalue()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-tar")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    old = os.umask(0o027)
    try:
        client = strata.Strata(f"http://127.0.0.1:{srv.server_address[1]}", "k", retry_for=0)
        from strata.files import _umask

        assert _umask() == 0o027
        strata.Sandbox.connect("sb-x", client=client).files.download("/d", tmp_path / "out")
        for name in ("open", "suid", "tmp"):
            st = (tmp_path / "out" / name).lstat()
            assert (oct(st.st_mode & 0o7777), st.st_uid) == (oct(0o750), os.getuid()), name
    finally:
        os.umask(old)
        srv.shutdown()


def test_upload_aborts_when_the_tree_cannot_be_read(tmp_path: Path, monkeypatch) -> None:
    """A failing tar producer breaks the request off: the server never sees
    the chunked body's end (so no partial tar is taken for a whole)."""
    import http.server
    import tarfile
    import threading

    seen: dict = {}

    class H(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            complete = False
            try:
                while True:
                    line = self.rfile.readline()
                    if not line:
                        break
                    n = int(line.split(b";")[0], 16)
                    self.rfile.read(n + 2)
                    if n == 0:
                        complete = True
                        break
            except (OSError, ValueError):
                pass
            seen["complete"] = complete
            body = b'{"status":"success","data":{"path":"/x","size_bytes":1}}'
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = strata.Strata(f"http://127.0.0.1:{srv.server_address[1]}", "k", retry_for=0)
        sb = strata.Sandbox.connect("sb-x", client=client)
        src = tmp_path / "src"
        src.mkdir()
        (src / "a").write_bytes(os.urandom(200_000))
        (src / "b").write_text("b")
        real_add = tarfile.TarFile.add

        def add(self, name, *a, **k):
            if name.endswith("/b"):
                raise OSError("cannot read b")
            return real_add(self, name, *a, **k)

        monkeypatch.setattr(tarfile.TarFile, "add", add)
        try:
            sb.files.upload(src, "/x")
            raise AssertionError("upload should fail")
        except strata.StrataError as e:
            assert e.code == "upload_failed" and "cannot read b" in e.message
        for _ in range(100):
            if "complete" in seen:
                break
            __import__("time").sleep(0.05)
        assert seen.get("complete") is False
        monkeypatch.setattr(tarfile.TarFile, "add", real_add)
        assert sb.files.upload(src, "/x")["size_bytes"] == 1
        assert seen["complete"] is True
    finally:
        srv.shutdown()


def test_async_session_cancel_and_back_pressure() -> None:
    """AsyncSession over a stand-in session: cancelled __anext__ calls lose
    nothing and keep the order; the reader thread stays at most 64 chunks
    ahead (it waits, it does not drop); wait() returns the exit code."""
    import asyncio
    import queue
    import threading
    import time

    from strata.aio import ASYNC_QUEUE, AsyncSession
    from strata.exec import Output

    class Fake:
        id = "se-fake"
        reattached = 0
        _closing = False

        def __init__(self) -> None:
            self.q: "queue.Queue[Output | None]" = queue.Queue()
            self.exit_code: int | None = None
            self.taken = 0

        def next_chunk(self) -> Output | None:
            item = self.q.get()
            if item is None:
                self.q.put(None)
                self.exit_code = 0
                return None
            self.taken += 1
            return item

    fake = Fake()
    want = [f"{i}\n".encode() for i in range(300)]

    def produce() -> None:
        time.sleep(0.3)  # the first __anext__ calls are cancelled while nothing came
        for i, b in enumerate(want):
            fake.q.put(Output("stdout", b))
            if i < 20:
                time.sleep(0.01)
        fake.q.put(None)

    async def main() -> None:
        s = AsyncSession(fake)  # type: ignore[arg-type]
        threading.Thread(target=produce, daemon=True).start()
        got: list[bytes] = []
        cancelled = 0
        for _ in range(40):
            try:
                got.append((await asyncio.wait_for(s.__anext__(), 0.01)).data)
            except asyncio.TimeoutError:
                cancelled += 1
        assert cancelled >= 5
        await asyncio.sleep(0.5)  # the producer has put everything: the reader is held by the bound
        assert fake.taken <= len(got) + ASYNC_QUEUE + 1, (fake.taken, len(got))
        async for chunk in s:
            got.append(chunk.data)
        assert got == want
        assert await s.wait() == 0

    asyncio.run(main())


def test_scopes_and_access_bodies() -> None:
    """A token's scopes and a sandbox's access setting are sent as the API
    takes them (nothing for the default scopes), and read back."""
    import http.server
    import threading

    seen: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n).decode()
            seen.append(f"{self.command} {self.path} {body}")
            if self.path.endswith("/access"):
                data = {"id": "sb-x", "state": "running", "access": json.loads(body)}
            else:
                data = {"token": "sbt_x", "hint": "x", "created_at": "2026-01-01T00:00:00Z", "scopes": ["checkpoints", "snapshots"]}
            out = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_POST = do_PUT = _answer

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = strata.Strata(f"http://127.0.0.1:{srv.server_address[1]}", "k", retry_for=0)
        sb = strata.Sandbox.connect("sb-x", client=client)
        assert sb.access_token.issue().scopes == ["checkpoints", "snapshots"]
        sb.access_token.issue(scopes=["exec"])
        assert sb.set_access("none").access == "none"
        assert sb.set_access({"scopes": ["files"]}).access == {"scopes": ["files"]}
        assert sb.info.access == {"scopes": ["files"]}
    finally:
        srv.shutdown()
    assert seen == [
        "POST /v1/sandboxes/sb-x/access-token ",
        'POST /v1/sandboxes/sb-x/access-token {"scopes":["exec"]}',
        'PUT /v1/sandboxes/sb-x/access "none"',
        'PUT /v1/sandboxes/sb-x/access {"scopes":["files"]}',
    ], seen


def test_seed_shaped_checkpoints_env_and_labels(tmp_path: Path, monkeypatch) -> None:
    """The seeds' calls speak OpenComputer's CheckpointInfo (``id`` the ref)
    and its option names (``kind=``, ``retention_policy=`` with
    ``maxCount``), sync and asyncio; loam's ``comment=`` too; a fork from a
    ref needs no sandbox; creates, forks and lists carry env and labels."""
    import asyncio
    import http.server
    import threading

    seen: list[str] = []
    ref = "sn-0123456789abcdefghijklmn"

    def snap(name: str, memory: bool) -> dict:
        return {"id": "v1", "ref": ref, "name": name, "sandbox": "sb-x", "comment": "", "memory": memory, "auto": False,
                "pinned": False, "status": "ready", "size_bytes": 42, "created_at": "2026-01-01T00:00:00Z"}

    class H(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n).decode()
            seen.append(f"{self.command} {self.path} {body}")
            status, data = 200, {}
            if self.command == "POST" and self.path.endswith("/snapshots"):
                b = json.loads(body)
                data = snap(b.get("name", ""), b.get("memory", True))
            elif self.command == "GET" and self.path.endswith("/snapshots"):
                data = [snap("a", False)]
            elif self.command == "POST" and self.path == "/v1/sandboxes":
                b = json.loads(body)
                status, data = 202, {"id": "sb-f", "state": "running", "labels": b.get("labels", {}), "env": b.get("env")}
            elif self.command == "GET" and self.path.startswith("/v1/sandboxes?"):
                data = {"data": [{"id": "sb-l", "state": "running", "labels": {"team.io/tier_x": "A_b"}}],
                        "pagination": {"total": 1, "limit": 500, "offset": 0, "count": 1}}
            elif self.command == "PUT" and self.path.endswith("/labels"):
                data = {"id": "sb-x", "state": "running", "labels": json.loads(body)}
            elif self.command == "GET":
                data = {"id": "sb-x", "state": "running"}
            out = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_POST = do_PUT = do_GET = do_DELETE = _answer

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = strata.Strata(f"http://127.0.0.1:{srv.server_address[1]}", "k", retry_for=0)
        sb = strata.Sandbox.connect("sb-x", client=client)
        assert strata.Sandbox.connect("scratch", client=client).id == "sb-x"  # a name is read once: .id is the id
        assert strata.AsyncSandbox.connect("scratch", client=client).id == "scratch"  # no call
        cp = sb.create_checkpoint("autosave", kind="disk_only", retention_policy={"mode": "delete_oldest", "maxCount": 100})
        assert dict(cp) == {"id": ref, "sandboxId": "sb-x", "name": "autosave", "status": "ready", "sizeBytes": 42,
                            "createdAt": "2026-01-01T00:00:00Z", "snapshotId": "v1", "kind": "disk_only", "comment": ""}
        sb.create_checkpoint(comment="before upgrade")
        assert sb.list_checkpoints()[0]["id"] == ref
        sb.delete_checkpoint(cp["id"])
        fork = strata.Sandbox.create_from_checkpoint(cp["id"], timeout=600, client=client)
        assert fork.id == "sb-f"
        strata.Sandbox.create_from_checkpoint("v1", sandbox="scratch", labels={"owner": "docs"}, client=client)
        sb.fork(cp["id"], name="scratch-2", labels={"owner": "docs"})
        made = strata.Sandbox.create(env={"MY_VAR": "1"}, labels={"owner": "docs"}, client=client)
        assert made.info["env"] == {"MY_VAR": "1"}
        assert strata.Sandbox.list(labels={"owner": "docs", "tier": "a b"}, client=client)[0].info["labels"] == {"team.io/tier_x": "A_b"}
        assert sb.set_labels({"owner": "ops"})["labels"] == {"owner": "ops"}
        try:
            monkeypatch.delenv("CREATEOS_SANDBOX_ID", raising=False)
            alone = strata.Strata(client.api_url, "k", retry_for=0, credentials_file=str(tmp_path / "none.env"))
            strata.Sandbox.create_from_checkpoint("v1", client=alone)
            raise AssertionError("an id without its sandbox was sent")
        except strata.StrataError as e:
            assert e.code == "invalid_argument"

        async def asyncio_page() -> None:
            a = strata.AsyncSandbox.connect("sb-x", client=client)
            c = await a.create_checkpoint("after-build")
            assert c["id"] == ref and c["status"] == "ready"
            f = await strata.AsyncSandbox.create_from_checkpoint(c["id"], client=client)
            assert f.id == "sb-f"
            assert (await strata.AsyncSandbox.list(labels={"owner": "docs"}, client=client))[0].id == "sb-l"

        asyncio.run(asyncio_page())
    finally:
        srv.shutdown()
    import re

    got = [s for s in seen if not re.match(r"GET /v1/sandboxes/sb-[a-z]+(\?\S*)? ", s)]  # the waits
    assert got == [
        "GET /v1/sandboxes/scratch ",
        'POST /v1/sandboxes/sb-x/snapshots {"memory":false,"name":"autosave","retention":{"mode":"delete_oldest","max_count":100}}',
        'POST /v1/sandboxes/sb-x/snapshots {"comment":"before upgrade"}',
        "GET /v1/sandboxes/sb-x/snapshots ",
        f"DELETE /v1/sandboxes/sb-x/snapshots/{ref} ",
        f'POST /v1/sandboxes {{"from":{{"snapshot":"{ref}"}}}}',
        'POST /v1/sandboxes {"from":{"sandbox":"scratch","snapshot":"v1"},"labels":{"owner":"docs"}}',
        f'POST /v1/sandboxes {{"from":{{"sandbox":"sb-x","snapshot":"{ref}"}},"name":"scratch-2","labels":{{"owner":"docs"}}}}',
        'POST /v1/sandboxes {"env":{"MY_VAR":"1"},"labels":{"owner":"docs"}}',
        "GET /v1/sandboxes?limit=500&offset=0&label=owner%3Ddocs&label=tier%3Da+b ",
        'PUT /v1/sandboxes/sb-x/labels {"owner":"ops"}',
        'POST /v1/sandboxes/sb-x/snapshots {"name":"after-build"}',
        f'POST /v1/sandboxes {{"from":{{"snapshot":"{ref}"}}}}',
        "GET /v1/sandboxes?limit=500&offset=0&label=owner%3Ddocs ",
    ], got
