"""Fixtures: the stack given by CREATEOS_API_URL and CREATEOS_API_KEY (an
account key), one sandbox shared by every test, and a summary of the API
routes the run reached."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator

import pytest

SDK = Path(__file__).resolve().parents[1]
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(SDK / "src"))
sys.path.insert(0, str(SDK / "examples"))

from strata import Sandbox, Strata, StrataError  # noqa: E402
RUN = uuid.uuid4().hex[:6]
# The (method, path) of every call the tests' client sent, for the summary
# of the routes reached (the SDK keeps no list: its on_request hook tells).
CALLS: set[tuple[str, str]] = set()
OPENAPI = REPO / "hostproxy" / "openapi.json"


def _need_stack() -> tuple[str, str]:
    url, key = os.environ.get("CREATEOS_API_URL"), os.environ.get("CREATEOS_API_KEY")
    if not url or not key:
        pytest.fail(
            "these tests run against a real strata stack: set CREATEOS_API_URL and CREATEOS_API_KEY "
            "(an account key), e.g. CREATEOS_API_URL=http://127.0.0.1:8080 "
            "CREATEOS_API_KEY=$(cat /var/lib/strata/api-key)",
            pytrace=False,
        )
    return url, key


@pytest.fixture(scope="session")
def client() -> Strata:
    url, key = _need_stack()
    deadline = time.monotonic() + 180
    while True:  # the service may be restarting
        try:
            urllib.request.urlopen(url.rstrip("/") + "/v1/health", timeout=5).read()
            break
        except OSError as e:
            if time.monotonic() > deadline:
                pytest.fail(f"the API at {url} does not answer: {e}", pytrace=False)
            time.sleep(2)
    return Strata(url, key, retry_for=180.0, on_request=lambda method, path: CALLS.add((method, path)))


@pytest.fixture(scope="session")
def sb(client: Strata) -> Iterator[Sandbox]:
    try:
        sandbox = Sandbox.create(name=f"sdk-test-{RUN}", client=client)
    except StrataError as e:
        if e.data.get("id"):  # made, but it did not come to running: not left behind
            try:
                Sandbox.connect(e.data["id"], client=client).kill()
            except StrataError:
                pass
        raise
    try:
        yield sandbox
    finally:
        try:
            sandbox.kill()
        finally:
            # Anything of this run left behind (forks of a failed test).
            for other in Sandbox.list(client=client):
                if other.info.get("name", "").startswith(f"sdkt{RUN}") and other.id != sandbox.id:
                    try:
                        other.kill()
                    except StrataError:
                        pass


@pytest.fixture()
def name() -> str:
    """A fresh name prefix for what a test makes (forks are found by it at the end)."""
    return f"sdkt{RUN}-{uuid.uuid4().hex[:4]}"


def _templates() -> list[tuple[str, str, re.Pattern[str]]]:
    doc = json.loads(OPENAPI.read_text())
    out = []
    for path, ops in doc["paths"].items():
        rx = re.escape(path)
        rx = rx.replace(re.escape("{path}"), ".+")
        rx = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", rx)
        for m in ops:
            if m in ("get", "post", "put", "delete", "head", "patch"):
                out.append((m.upper(), path, re.compile("^" + rx + "$")))
    # the longest template first, so /files/{path} does not eat /checkpoints/…
    out.sort(key=lambda t: -len(t[1]))
    return out


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which routes of openapi.json this run reached through the SDK."""
    if not CALLS:
        return
    templates = _templates()
    reached = set()
    for method, path in CALLS:
        for m, tpl, rx in templates:
            if m == method and rx.match(path):
                reached.add((m, tpl))
                break
    from strata._routes import NON_SDK_ROUTES

    every = {(m, t) for m, t, _ in templates} - set(NON_SDK_ROUTES)
    missing = sorted(every - reached)
    terminalreporter.write_sep("-", f"API routes reached by this run: {len(reached & every)}/{len(every)}")
    for m, t in missing:
        terminalreporter.write_line(f"  not reached: {m} {t}")
