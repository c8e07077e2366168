"""loam's "Checkpoints" page (``../shared/seeds/000_…``), its TypeScript
lines, in Python (docs/sdk.md, "The seeds' examples"). Changed: loam's
client object, which this SDK does not have: ``loam.sandbox('scratch')`` is
``Sandbox.connect("scratch")`` (a sandbox by its name, as loam's), and
``loam.fork('scratch', cp.id, …)`` is ``box.fork(cp["id"], …)``. The page's
sandbox ``scratch`` must exist (the test makes it, as the page's ``loam
sandbox create scratch``).

    CREATEOS_API_URL=… CREATEOS_API_KEY=… python3 examples/loam.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    import strata  # noqa: F401
except ImportError:  # run from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from strata import Sandbox


def main() -> dict[str, Any]:
    box = Sandbox.connect("scratch")  # changed: was loam.sandbox('scratch')
    cp = box.create_checkpoint(comment="before upgrade")  # memory: true by default
    box.restore_checkpoint(cp["id"])
    fork = box.fork(cp["id"], name="scratch-2", labels={"owner": "docs"})  # changed: was loam.fork('scratch', cp.id, …)
    box.delete_checkpoint(cp["id"])
    return {"box": box, "cp": cp, "fork": fork}


if __name__ == "__main__":
    main()
