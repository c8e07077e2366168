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
    sandbox: the session says so. The resume loads the guest's memory
    again, which makes the session another run (its generation changes,
    docs/api.md "Generations"): reattach() is session_restored, and never
    splices; exec.attach from the offset reached follows the new run."""
    s = sb.exec.start("echo a; read x; echo b-$x", detachable=True)
    assert next(iter(s)).data == b"a\n"
    generation = s.generation
    assert sb.pause()["state"] == "paused"
    assert sb.info.state == "paused"
    with pytest.raises(StrataError) as e:
        sb.exec.run("true")
    assert e.value.status == 409 and e.value.code == "sandbox_not_running" and e.value.data["state"] == "paused"
    with pytest.raises(StrataError) as e:
        s.wait(timeout=60)
    assert e.value.code == "sandbox_not_running" and e.value.data["state"] == "paused"
    assert not s.attached
    s.write("z\n")  # while detached: kept for a reattach, which the resume refuses
    assert sb.resume()["state"] == "running"
    with pytest.raises(StrataError) as e:
        s.reattach()
    assert e.value.status == 409 and e.value.code == "session_restored", repr(e.value)
    again = sb.exec.attach(s.id, since=s.offset)
    assert again.generation and again.generation != generation
    again.write("z\n")
    out, _ = again.output()
    assert out == b"b-z\n" and again.exit_code == 0


def test_stop_start(sb: Sandbox) -> None:
    sb.exec.run("echo kept > /root/kept && sync")
    assert sb.stop()["state"] == "stopped"
    assert sb.start()["state"] == "running"
    assert sb.exec.run("cat /root/kept").stdout == "kept\n"
