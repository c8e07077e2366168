"""OpenComputer's "Checkpoints" page, its Python API reference snippets,
with the synchronous client (the page's lines without ``await``),
transliterated as ``opencomputer_reference_async.py`` is (docs/sdk.md,
"The seeds' examples").

    CREATEOS_API_URL=… CREATEOS_API_KEY=… python3 examples/opencomputer_reference.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    import strata  # noqa: F401
except ImportError:  # run from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from strata import Sandbox  # changed: was "from opencomputer import Sandbox"


def main() -> dict[str, Any]:
    sandbox = Sandbox.create()  # added: the sandbox the snippets use

    # Create Checkpoint
    checkpoint = sandbox.create_checkpoint("before-migration")
    # checkpoint["id"], checkpoint["status"]
    checkpoint_id = checkpoint["id"]  # added: the id the snippets name
    first = checkpoint  # added: for the test

    checkpoint = sandbox.create_checkpoint(
        "autosave",
        kind="disk_only",
        retention_policy={"mode": "delete_oldest", "maxCount": 100},
    )

    # List Checkpoints
    checkpoints = sandbox.list_checkpoints()

    # Fork from Checkpoint
    forked = Sandbox.create_from_checkpoint(checkpoint_id, timeout=600)

    # Restore Checkpoint
    sandbox.restore_checkpoint(checkpoint_id)

    # Delete Checkpoint
    sandbox.delete_checkpoint(checkpoint_id)
    return {"sandbox": sandbox, "first": first, "checkpoint": checkpoint, "checkpoints": checkpoints, "forked": forked}


if __name__ == "__main__":
    main()
