"""Records: the API's JSON objects, as dicts whose keys also read as attributes."""

from __future__ import annotations

from typing import Any


class Record(dict[str, Any]):
    """A JSON object of the API (a sandbox, checkpoint, snapshot, session record …).

    It is a plain ``dict`` with the API's field names (``cp["id"]``, as the
    seeds' Python examples use them), whose keys can also be read as
    attributes (``cp.id``). A missing key read as an attribute is ``None``
    for the optional fields the API leaves out (``parent_id``, ``error``,
    ``exit_code`` …) — use ``"key" in record`` to tell them apart.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {k for k in self if isinstance(k, str)})


def to_record(value: Any) -> Any:
    """Turn JSON objects into Records, recursively (lists stay lists)."""
    if isinstance(value, dict):
        return Record({k: to_record(v) for k, v in value.items()})
    if isinstance(value, list):
        return [to_record(v) for v in value]
    return value
