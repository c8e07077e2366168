"""The lifecycle of the shared sandbox: pause, resume, stop, start (last:
they end sessions and cost a boot)."""

from __future__ import annotations

import pytest

from strata import Sandbox, StrataError


def test_list_connect_refresh(sb: Sandbox) -> None:
    listed = {s.id: s for s in Sandbox.list(client=sb.client)}
    assert listed[sb.id].info.name == sb.info.name
    other = Sandbox.connect(sb.id, client=sb.client)
    assert other.refresh().id == sb.id and other.state == "running"


def test_pause_resume_with_a_session(sb: Sandbox) -> None:
    """A pause ends the attachment and the SDK does not wait for a paused
    sandbox: the session says so; after the resume, reattach() goes on from
    its offset and sends the stdin written meanwhile."""
    s = sb.exec.start("echo a; read x; echo b-$x", detachable=True)
    assert next(iter(s)).data == b"a\n"
    assert sb.pause()["state"] == "paused"
    assert sb.info.state == "paused"
    with pytest.raises(StrataError) as e:
        sb.exec.run("true")
    assert e.value.status == 409 and e.value.code == "sandbox_not_running" and e.value.data["state"] == "paused"
    with pytest.raises(StrataError) as e:
        s.wait(timeout=60)
    assert e.value.code == "sandbox_not_running" and e.value.data["state"] == "paused"
    assert not s.attached
    s.write("z\n")  # while detached: sent once attached again
    assert sb.resume()["state"] == "running"
    s.reattach()
    out, _ = s.output()
    assert out == b"b-z\n" and s.exit_code == 0


def test_stop_start(sb: Sandbox) -> None:
    sb.exec.run("echo kept > /root/kept && sync")
    assert sb.stop()["state"] == "stopped"
    assert sb.start()["state"] == "running"
    assert sb.exec.run("cat /root/kept").stdout == "kept\n"
