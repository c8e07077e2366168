"""Checks that need no stack: the route table against openapi.json, the
reference docs, the build backend, the credentials file, WebSocket framing."""

from __future__ import annotations

import hashlib
import base64
import csv
import io
import json
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
    """The in-tree backend builds a wheel whose RECORD hashes match, and an sdist."""
    code = (
        "import sys; sys.path.insert(0, '_build'); import strata_build as b;"
        f"print(b.build_wheel({str(tmp_path)!r})); print(b.build_sdist({str(tmp_path)!r})); print(b.build_editable({str(tmp_path / 'e')!r}) if (__import__('os').makedirs({str(tmp_path / 'e')!r}) or True) else '')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=SDK, capture_output=True, text=True, check=True).stdout.split()
    wheel = tmp_path / out[0]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert "strata/__init__.py" in names and "strata/py.typed" in names
        record = next(n for n in names if n.endswith("RECORD"))
        for path, digest, size in csv.reader(io.StringIO(zf.read(record).decode())):
            if path == record:
                continue
            data = zf.read(path)
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == want and int(size) == len(data), path
    assert (tmp_path / out[1]).exists()
