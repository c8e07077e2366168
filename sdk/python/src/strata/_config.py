"""Where the API is and which key to use: arguments, environment, credentials file.

Inside a sandbox guestd writes ``/run/strata/credentials.env`` (root only)
with lines ``NAME='value'`` for ``CREATEOS_API_URL``, ``CREATEOS_API_KEY``
and ``CREATEOS_SANDBOX_ID``; each variable the environment lacks is taken
from there, so a program in a sandbox needs no set-up.
``CREATEOS_CREDENTIALS`` names another file (tests, tools).
"""

from __future__ import annotations

import os

ENV_API_URL = "CREATEOS_API_URL"
ENV_API_KEY = "CREATEOS_API_KEY"
ENV_SANDBOX_ID = "CREATEOS_SANDBOX_ID"
ENV_CREDENTIALS = "CREATEOS_CREDENTIALS"
DEFAULT_CREDENTIALS = "/run/strata/credentials.env"


def credentials_file() -> str:
    """The credentials file to read: ``$CREATEOS_CREDENTIALS``, else the default."""
    return os.environ.get(ENV_CREDENTIALS) or DEFAULT_CREDENTIALS


def read_credentials(path: str | None = None) -> dict[str, str]:
    """Parse ``NAME='value'`` lines (as guestd writes them); a missing or
    unreadable file is no values. Lines starting with ``#`` are skipped, and
    an ``export`` prefix is allowed."""
    out: dict[str, str] = {}
    try:
        with open(path or credentials_file(), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        name = name.strip()
        if name.startswith("export "):
            name = name[len("export ") :].strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name] = value
    return out


def lookup(name: str, path: str | None = None) -> str | None:
    """The variable from the environment, else from the credentials file."""
    value = os.environ.get(name)
    if value:
        return value
    return read_credentials(path).get(name) or None
