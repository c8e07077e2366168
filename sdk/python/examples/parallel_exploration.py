"""The seeds' "parallel exploration": one prepared sandbox, a VM snapshot of
it, three forks, a different command in each, the results gathered, the
forks killed.

    CREATEOS_API_URL=… CREATEOS_API_KEY=… python3 examples/parallel_exploration.py

(``create_checkpoint`` is the seeds' name for a VM snapshot; each fork
starts with the snapshot's disk and memory.)
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

try:
    import strata  # noqa: F401
except ImportError:  # run from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from strata import Sandbox, Strata

STRATEGIES = ["ours", "theirs", "union"]


def explore(source: Sandbox, snapshot_id: str, strategy: str) -> dict[str, Any]:
    """Fork the snapshot, try one strategy in the fork, kill the fork."""
    fork = Sandbox.create_from_checkpoint(snapshot_id, sandbox=source.id, client=source.client)
    try:
        result = fork.exec.run(
            f"cd /app && printf '%s\\n' {strategy} >> log && echo $(wc -l < log) lines, last: $(tail -1 log)"
        )
        return {"strategy": strategy, "fork": fork.id, "exit_code": result.exit_code, "output": result.stdout.strip()}
    finally:
        fork.kill()


def main(sandbox: Sandbox | None = None, parallel: int = 3, client: Strata | None = None) -> list[dict[str, Any]]:
    """Run the exploration; with ``sandbox``, from that one (left running),
    else from a new sandbox (killed at the end). ``parallel`` bounds the
    forks alive at once."""
    own = sandbox is None
    sb = sandbox if sandbox is not None else Sandbox.create(client=client)
    snapshot = None
    try:
        sb.exec.run("mkdir -p /app && cd /app && echo base > log")
        snapshot = sb.create_checkpoint(f"fresh-clone-{sb.id[-6:]}")
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            results = list(pool.map(lambda s: explore(sb, snapshot["id"], s), STRATEGIES))
        for r in results:
            print(f"{r['strategy']:>8}: exit {r['exit_code']}  {r['output']}  ({r['fork']})")
        return results
    finally:
        if own:
            sb.kill()
        elif snapshot is not None:
            sb.delete_checkpoint(snapshot["id"])


if __name__ == "__main__":
    main()
