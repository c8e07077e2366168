"""OpenComputer's "Checkpoints" page (``../shared/seeds/003_…``), its first
Python example, as written for asyncio (the page awaits every call),
transliterated (docs/sdk.md, "The seeds' examples"). Changed: the import
(``AsyncSandbox`` under the page's name ``Sandbox``); the npm commands,
which need a network sandboxes do not have yet, replaced by a local
project (``_project``); and the page's lines are the body of ``main()``
(top-level ``await`` is not Python), which returns what they made.

    CREATEOS_API_URL=… CREATEOS_API_KEY=… python3 examples/opencomputer_checkpoints_async.py
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

from _project import BUILD, PROJECT, TEST_E2E, TEST_UNIT  # changed: a local project, no network

from strata import AsyncSandbox as Sandbox  # changed: was "from opencomputer import Sandbox"


async def main() -> dict[str, Any]:
    sandbox = await Sandbox.create()
    await sandbox.exec.run(PROJECT)  # changed: the project, written locally
    await sandbox.exec.run(BUILD, cwd="/app")  # changed: was "npm install && npm run build"

    cp = await sandbox.create_checkpoint("after-build")

    a = await Sandbox.create_from_checkpoint(cp["id"])
    b = await Sandbox.create_from_checkpoint(cp["id"])

    await a.exec.run(TEST_UNIT, cwd="/app")  # changed: was "npm run test:unit"
    await b.exec.run(TEST_E2E, cwd="/app")  # changed: was "npm run test:e2e"
    return {"sandbox": sandbox, "cp": cp, "a": a, "b": b}


if __name__ == "__main__":
    asyncio.run(main())
