"""OpenComputer's "Checkpoints" page, "Example: Parallel Exploration" (given
there in TypeScript), in Python for asyncio: ``asyncio.gather`` for
``Promise.all``, the same calls in snake_case (docs/sdk.md, "The seeds'
examples"). Changed as in TypeScript: the clone of
``https://github.com/user/repo`` is of a local repository (the machines
these examples are tested on reach no such host). Right after a clone there is nothing to merge (exit 0),
and git has no strategy ``theirs`` (exit 1).

    CREATEOS_API_URL=… CREATEOS_API_KEY=… python3 examples/opencomputer_parallel_exploration.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import strata  # noqa: F401
except ImportError:  # run from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _project import CLONE, REPOSITORY  # changed: a local repository, no network

from strata import AsyncSandbox as Sandbox


async def main() -> dict[str, Any]:
    sandbox = await Sandbox.create()
    await sandbox.exec.run(REPOSITORY)  # changed: the repository, made locally
    await sandbox.exec.run(CLONE)  # changed: was "git clone https://github.com/user/repo /app"
    cp = await sandbox.create_checkpoint("fresh-clone")

    # Try three different migration strategies in parallel
    strategies = ["--strategy=ours", "--strategy=theirs", "--strategy=recursive"]

    async def explore(strategy: str) -> dict[str, Any]:
        fork = await Sandbox.create_from_checkpoint(cp["id"])
        result = await fork.exec.run(f"cd /app && git merge origin/main {strategy}")
        await fork.kill()
        return {"strategy": strategy, "exit_code": result.exit_code}

    results = await asyncio.gather(*(explore(s) for s in strategies))
    return {"sandbox": sandbox, "cp": cp, "results": results}


if __name__ == "__main__":
    for r in asyncio.run(main())["results"]:
        print(f"{r['strategy']}: exit {r['exit_code']}")
