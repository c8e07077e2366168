"""Inside a sandbox, with nothing configured: the guest image's own copy
of the SDK (linked into the system Python's dist-packages at boot) reads
/run/strata/credentials.env, and Sandbox.connect() is that sandbox."""

from __future__ import annotations

from strata import Sandbox


def test_inside_a_sandbox(sb: Sandbox, name: str) -> None:
    d = f"/workspace/{name}"
    sb.exec.run(f"mkdir -p {d} && echo x > {d}/f")
    code = (
        "import strata; from strata import Sandbox; sb = Sandbox.connect(); "
        f"cp = sb.checkpoints.create(path={d!r}); print(sb.id, cp['id'], strata.__file__)"
    )
    # env -i: no CREATEOS_* variable, only the credentials file
    r = sb.exec.run(["env", "-i", "PATH=/usr/bin:/bin", "python3", "-c", code])
    try:
        assert r.exit_code == 0, r.stderr
        sid, cp, where = r.stdout.split()
        assert sid == sb.id and cp in [c.id for c in sb.checkpoints.list(path=d)]
        assert where.startswith("/usr/local/lib/python3.") and where.endswith("/dist-packages/strata/__init__.py"), where
    finally:
        sb.checkpoints.release(d)
        sb.exec.run(f"rm -rf {d}")
