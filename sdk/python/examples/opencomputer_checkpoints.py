"""OpenComputer's "Checkpoints" page, its first Python example, with the
synchronous client: the page's lines without ``await``, transliterated as
``opencomputer_checkpoints_async.py`` is (docs/sdk.md, "The seeds'
examples"): the import, the npm commands (a local project: the machines these
examples are tested on reach no npm project), and the lines as the body of ``main()``.

    CREATEOS_API_URL=… CREATEOS_API_KEY=… python3 examples/opencomputer_checkpoints.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import strata  # noqa: F401
except ImportError:  # run from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _project import BUILD, PROJECT, TEST_E2E, TEST_UNIT  # changed: a local project, no network

from strata import Sandbox  # changed: was "from opencomputer import Sandbox"


def main() -> dict[str, Any]:
    sandbox = Sandbox.create()
    sandbox.exec.run(PROJECT)  # changed: the project, written locally
    sandbox.exec.run(BUILD, cwd="/app")  # changed: was "npm install && npm run build"

    cp = sandbox.create_checkpoint("after-build")

    a = Sandbox.create_from_checkpoint(cp["id"])
    b = Sandbox.create_from_checkpoint(cp["id"])

    a.exec.run(TEST_UNIT, cwd="/app")  # changed: was "npm run test:unit"
    b.exec.run(TEST_E2E, cwd="/app")  # changed: was "npm run test:e2e"
    return {"sandbox": sandbox, "cp": cp, "a": a, "b": b}


if __name__ == "__main__":
    main()
