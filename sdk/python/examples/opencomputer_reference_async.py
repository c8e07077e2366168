"""OpenComputer's "Checkpoints" page, its Python API reference snippets
(create, the retention policy, list, fork, restore, delete), one after the
other as the page gives them, for asyncio, transliterated (docs/sdk.md,
"The seeds' examples"). Changed: the import. Added, marked so: the sandbox
the snippets use and the id they name (``checkpoint_id``: the first
snippet's checkpoint); the lines are the body of ``main()``.

    CREATEOS_API_URL=… CREATEOS_API_KEY=… python3 examples/opencomputer_reference_async.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

try:
    import strata  # noqa: F401
except ImportError:  # run from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from strata import AsyncSandbox as Sandbox  # changed: was "from opencomputer import Sandbox"


async def main() -> dict[str, Any]:
    sandbox = await Sandbox.create()  # added: the sandbox the snippets use

    # Create Checkpoint
    checkpoint = await sandbox.create_checkpoint("before-migration")
    # checkpoint["id"], checkpoint["status"]
    checkpoint_id = checkpoint["id"]  # added: the id the snippets name
    first = checkpoint  # added: for the test

    checkpoint = await sandbox.create_checkpoint(
        "autosave",
        kind="disk_only",
        retention_policy={"mode": "delete_oldest", "maxCount": 100},
    )

    # List Checkpoints
    checkpoints = await sandbox.list_checkpoints()

    # Fork from Checkpoint
    forked = await Sandbox.create_from_checkpoint(checkpoint_id, timeout=600)

    # Restore Checkpoint
    await sandbox.restore_checkpoint(checkpoint_id)

    # Delete Checkpoint
    await sandbox.delete_checkpoint(checkpoint_id)
    return {"sandbox": sandbox, "first": first, "checkpoint": checkpoint, "checkpoints": checkpoints, "forked": forked}


if __name__ == "__main__":
    asyncio.run(main())
