"""The seeds' "parallel exploration" example, from the shared sandbox."""

from __future__ import annotations

import parallel_exploration
from strata import Sandbox


def test_parallel_exploration(sb: Sandbox) -> None:
    # two forks at once: with the shared sandbox, at most three of ours live
    results = parallel_exploration.main(sandbox=sb, parallel=2)
    assert [r["strategy"] for r in results] == parallel_exploration.STRATEGIES
    for r in results:
        assert r["exit_code"] == 0
        assert r["output"] == f"2 lines, last: {r['strategy']}"  # each fork its own copy of /app/log
    assert len({r["fork"] for r in results}) == 3
    alive = {s.id for s in Sandbox.list(client=sb.client)}
    assert not alive & {r["fork"] for r in results}
