"""Access tokens, and an error of each class."""

from __future__ import annotations

import pytest

from strata import Sandbox, Strata, StrataError


def test_default_token_scopes(sb: Sandbox) -> None:
    """A token issued without scopes has checkpoints and snapshots: not
    exec, not files (403 naming the scope)."""
    sb.access_token.revoke()
    t = sb.access_token.issue()
    try:
        assert t.scopes == ["checkpoints", "snapshots"]
        as_token = Sandbox.connect(sb.id, client=Strata(sb.client.api_url, t.token))
        assert isinstance(as_token.checkpoints.list(), list)
        assert isinstance(as_token.snapshots.list(), list)
        # files.list, not files.exists: a HEAD's 403 has no body to name
        # the scope.
        for call, scope in ((lambda: as_token.exec.run("true"), "exec"), (lambda: as_token.files.list("/tmp"), "files")):
            with pytest.raises(StrataError) as e:
                call()
            assert (e.value.status, e.value.code) == (403, "forbidden") and e.value.data.get("scope") == scope
    finally:
        sb.access_token.revoke()


def test_access_token(sb: Sandbox) -> None:
    sb.access_token.revoke()
    assert sb.access_token.get().enabled is False
    scopes = ["checkpoints", "snapshots", "files"]
    t = sb.access_token.issue(scopes=scopes)
    try:
        assert t.token.startswith("sbt_") and t.hint == t.token[-4:] and t.scopes == scopes
        assert sb.access_token.get() == {"enabled": True, "hint": t.hint, "created_at": t.created_at, "scopes": scopes}
        with pytest.raises(StrataError) as e:
            sb.access_token.issue()
        assert e.value.status == 409 and e.value.code == "token_exists"
        as_token = Sandbox.connect(sb.id, client=Strata(sb.client.api_url, t.token))
        assert isinstance(as_token.checkpoints.list(), list)  # a token may use its sandbox's checkpoints
        assert as_token.files.exists("/tmp")  # and, with the files scope, its files
        with pytest.raises(StrataError) as e:  # 403: a token on a lifecycle route
            as_token.pause()
        assert e.value.status == 403 and e.value.code == "forbidden"
        r = sb.access_token.rotate()
        assert r.token != t.token and r.scopes == scopes
        with pytest.raises(StrataError) as e:  # the old one is gone
            as_token.checkpoints.list()
        assert e.value.status == 401 and e.value.code == "unauthorized"
    finally:
        sb.access_token.revoke()
    with pytest.raises(StrataError) as e:
        sb.access_token.rotate()
    assert e.value.status == 404 and e.value.code == "token_not_found"


def test_access_setting(sb: Sandbox) -> None:
    """The access setting: shown, set, and "none" takes the guest's key away."""
    assert sb.refresh().access == {"scopes": ["checkpoints", "snapshots"]}
    try:
        assert sb.set_access("none").access == "none"
        out = sb.exec.run(["sh", "-c", "grep -c CREATEOS_API_KEY /run/strata/credentials.env || true"]).stdout
        assert out.strip() == "0"
        assert sb.set_access({"scopes": ["exec", "checkpoints"]}).access == {"scopes": ["checkpoints", "exec"]}
        with pytest.raises(StrataError) as e:
            sb.set_access({"scopes": ["root"]})
        assert (e.value.status, e.value.code) == (400, "invalid_field")
    finally:
        sb.set_access({"scopes": ["checkpoints", "snapshots"]})


def test_errors(sb: Sandbox, client: Strata) -> None:
    cases = [
        (400, "invalid_field", lambda: sb.files.remove("/")),
        (400, "invalid_field", lambda: Sandbox.create(memory_mib=1, client=client)),
        (401, "unauthorized", lambda: Sandbox.list(client=Strata(client.api_url, "sk_not_a_key_of_anyone_at_all"))),
        (404, "sandbox_not_found", lambda: Sandbox.connect("sb-doesnotexist000000000000", client=client).refresh()),
        (404, "checkpoint_not_found", lambda: sb.checkpoints.restore("cp_AAAAAAAAAAAAAAAAAAAAAA")),
        (404, "session_not_found", lambda: sb.exec.get("se-0000000000000000")),
        (404, "snapshot_not_found", lambda: sb.snapshots.get("v999999")),
        (409, "name_taken", lambda: Sandbox.create(name=sb.info.name, client=client)),
        (422, "path_not_absolute", lambda: sb.checkpoints.create(path="relative")),
    ]
    for status, code, call in cases:
        with pytest.raises(StrataError) as e:
            call()
        err = e.value
        assert (err.status, err.code) == (status, code), repr(err)
        assert err.message and err.request_id
        assert str(status) in str(err)
    with pytest.raises(StrataError) as e:
        sb.checkpoints.create(path="/proc/x" + "\x00")
    assert e.value.code == "invalid_field" and e.value.data.get("field") == "path"


def test_sdk_error_codes(sb: Sandbox) -> None:
    """The codes of the errors the SDK makes itself."""
    for call in (lambda: sb.files.read("relative"), lambda: sb.exec.run("cat", stdin=b"\xff\xfe"), lambda: sb.exec.run([])):
        with pytest.raises(StrataError) as e:
            call()
        assert (e.value.code, e.value.status) == ("invalid_argument", 0), repr(e.value)
    assert sb.exec.run("cat", stdin="é".encode()).stdout == "é"
    with pytest.raises(StrataError) as e:
        Sandbox.list(client=Strata("http://127.0.0.1:1", "k", retry_for=0.5))
    assert (e.value.code, e.value.status) == ("network_error", 0)
    with pytest.raises(StrataError) as e:
        sb.exec.start("sleep 5").wait(timeout=0.2)
    assert e.value.code == "wait_timeout"
