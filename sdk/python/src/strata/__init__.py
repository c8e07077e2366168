"""strata: the Python SDK of strata sandboxes (QEMU microVMs with
copy-on-write checkpoints), over its public HTTP API.

    from strata import Sandbox, AsyncSandbox, StrataError

    sb = Sandbox.create()
    print(sb.exec.run("echo hi").stdout)
    dcp = sb.checkpoints.create(path="/workspace/project")  # a directory checkpoint
    cp = sb.create_checkpoint("after-build")                 # a VM snapshot (the seeds' name)
    fork = Sandbox.create_from_checkpoint(cp["id"])          # cp["id"] is its ref: no sandbox needed
    fork.kill(); sb.kill()

Configuration: ``Strata(api_url=…, api_key=…)`` passed as ``client=``, or
``strata.configure(…)``, or ``CREATEOS_API_URL`` / ``CREATEOS_API_KEY``
(and ``CREATEOS_SANDBOX_ID``), read inside a sandbox from
``/run/strata/credentials.env`` for any the environment lacks.

Levels: ``sb.checkpoints`` are **directory** checkpoints (one directory's
files, inside a running sandbox); ``sb.snapshots`` are **VM snapshots**
(the whole machine), which the seeds call checkpoints: hence
``create_checkpoint``, ``list_checkpoints``, ``restore_checkpoint``,
``delete_checkpoint``, ``fork`` and ``create_from_checkpoint``.
Every failure is a ``StrataError`` (``.code``, ``.message``, ``.status``,
``.data``, ``.request_id``).
"""

from ._client import Strata, configure, default_client, __version__
from ._errors import StrataError
from ._records import Record
from .aio import AsyncAccessToken, AsyncNetwork, AsyncCheckpoints, AsyncExec, AsyncFiles, AsyncSandbox, AsyncSession, AsyncSnapshots
from .checkpoints import Checkpoints
from .exec import Exec, ExecResult, Output, Session
from .files import Files, FileStream
from .sandbox import ForkList, Sandbox
from .snapshots import Snapshots, checkpoint_info
from .network import Network
from .tokens import AccessToken

__all__ = [
    "AccessToken",
    "Network",
    "AsyncNetwork",
    "AsyncAccessToken",
    "AsyncCheckpoints",
    "AsyncExec",
    "AsyncFiles",
    "AsyncSandbox",
    "AsyncSession",
    "AsyncSnapshots",
    "Checkpoints",
    "Exec",
    "ExecResult",
    "FileStream",
    "Files",
    "ForkList",
    "Output",
    "Record",
    "Sandbox",
    "Session",
    "Snapshots",
    "Strata",
    "StrataError",
    "configure",
    "default_client",
    "__version__",
    "checkpoint_info",
]
