"""exec.run and sessions, including an attachment that survives a memory snapshot."""

from __future__ import annotations

import threading
import time

import pytest

from strata import Sandbox, StrataError


def test_run_string_and_list(sb: Sandbox) -> None:
    r = sb.exec.run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.truncated) == (3, "out\n", "err\n", False, False)
    assert r.duration_ms >= 0
    r = sb.exec.run(["printf", "%s|", "a b", "c"])
    assert r.stdout == "a b|c|" and r.ok


def test_run_cwd_env_stdin_timeout(sb: Sandbox) -> None:
    r = sb.exec.run("pwd; echo $FOO; cat", cwd="/tmp", env={"FOO": "bar"}, stdin="in\n")
    assert r.stdout == "/tmp\nbar\nin\n"
    r = sb.exec.run("sleep 30", timeout_s=1)
    assert r.timed_out and r.exit_code == -1
    r = sb.exec.run(["sh", "-c", "printf '\\377\\000x'"])
    assert r.stdout_bytes == b"\xff\x00x"


def test_run_program_missing(sb: Sandbox) -> None:
    with pytest.raises(StrataError) as e:
        sb.exec.run(["/no/such/program"])
    assert e.value.status == 422 and e.value.code == "exec_failed"


def test_session_streams(sb: Sandbox) -> None:
    s = sb.exec.start("echo start; cat; echo oops >&2; exit 7", cwd="/tmp")
    s.write("hello\n")
    s.write(b"x" * 200_000 + b"\n")  # over one frame: sent in several
    s.close_stdin()
    out, err = s.output()
    assert out == b"start\nhello\n" + b"x" * 200_000 + b"\n"
    assert err == b"oops\n"
    assert s.wait() == 7 and s.exit_code == 7
    assert s.offset == len(out) + len(err)


def test_session_tty_resize_signal_kill(sb: Sandbox) -> None:
    s = sb.exec.start("stty size; read l; stty size; sleep 60", tty=True, rows=10, cols=40, detachable=True)
    first = b""
    for chunk in s:
        first += chunk.data
        if b"10 40" in first:
            break
    s.resize(33, 99)
    s.write("go\n")
    seen = b""
    for chunk in s:
        assert chunk.stream == "stdout"  # a terminal has one stream
        seen += chunk.data
        if b"33 99" in seen:
            break
    assert any(x["id"] == s.id for x in sb.exec.list())
    assert sb.exec.get(s.id)["state"] == "running"
    time.sleep(0.5)  # past the second stty: the signal is for sleep and its shell
    s.signal("INT")
    code = s.wait(timeout=30)
    assert code == 128 + 2
    s2 = sb.exec.start(["sleep", "60"], detachable=True)
    rec = s2.kill()
    assert rec["id"] == s2.id
    assert s2.wait(timeout=30) == 128 + 15


def test_attach_later(sb: Sandbox) -> None:
    s = sb.exec.start("echo one; sleep 1; echo two", detachable=True)
    s.close()  # detach: the session goes on
    again = sb.exec.attach(s.id)
    out, _ = again.output()
    assert out == b"one\ntwo\n" and again.exit_code == 0
    tail = sb.exec.attach(s.id, since=4)
    assert tail.output()[0] == b"two\n"


def test_session_timeout(sb: Sandbox) -> None:
    s = sb.exec.start("sleep 30", timeout_s=1)
    assert s.wait(timeout=30) == -1


def test_reattach_across_memory_snapshot(sb: Sandbox) -> None:
    """A memory snapshot ends the attachment with 1011; the session attaches
    again from its offset: no output lost or repeated (offsets exact), and
    every line written while detached or after the reattach arrives."""
    s = sb.exec.start("while read l; do echo got-$l; done; echo end", detachable=False)
    lines: list[str] = []
    received = [0]
    done = threading.Event()
    snap: dict = {}
    must_arrive: list[int] = []

    def take() -> None:
        try:
            snap["rec"] = sb.snapshots.create(comment="sdk reattach test")
        except BaseException as e:  # reported below
            snap["err"] = e
        finally:
            done.set()

    def read() -> None:
        buf = b""
        for chunk in s:
            buf += chunk.data
            received[0] += len(chunk.data)
        lines.extend(buf.decode().split())

    reader = threading.Thread(target=read)
    reader.start()
    n = 0
    for _ in range(5):
        n += 1
        s.write(f"{n}\n")
    time.sleep(1)
    threading.Thread(target=take).start()
    while not done.is_set():
        n += 1
        if not s.attached or s.reattached:
            must_arrive.append(n)
        s.write(f"{n}\n")
        time.sleep(0.02)
    for _ in range(5):
        n += 1
        must_arrive.append(n)
        s.write(f"{n}\n")
        time.sleep(0.05)
    time.sleep(1)
    s.close_stdin()
    reader.join(timeout=90)
    assert "err" not in snap, snap.get("err")
    try:
        assert s.exit_code == 0 and lines[-1] == "end"
        got = [int(x.split("-")[1]) for x in lines[:-1]]
        assert got == sorted(set(got)), f"output repeated or out of order: {got}"
        assert got[:5] == [1, 2, 3, 4, 5]
        assert set(must_arrive) <= set(got), f"lost after the reattach: {sorted(set(must_arrive) - set(got))}"
        assert s.offset == received[0] and s.dropped_bytes == 0
        assert s.reattached >= 1, "the snapshot should have ended the first attachment"
    finally:
        sb.snapshots.delete(snap["rec"]["id"])
