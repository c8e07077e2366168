"""A PEP 517 build backend written with the standard library alone.

Why: neither this machine nor CI reaches a package index, and pip's default
build isolation would otherwise download setuptools before it could build
anything. With ``requires = []`` and this backend in the tree
(``backend-path = ["_build"]``), ``pip install ./sdk/python`` works offline.

It builds a pure-Python wheel of ``src/strata`` (METADATA, WHEEL, RECORD with
sha256 hashes), an sdist (``.tar.gz`` with PKG-INFO), and an editable wheel
(a ``.pth`` file naming ``src``). File and directory names carry the
distribution name normalized (PEP 503, then ``-`` as ``_``: PEP 427 and
625); METADATA keeps the name as written. Both archives are reproducible:
times from ``SOURCE_DATE_EPOCH`` (1980-01-01 without it), owners 0 and
nameless, members in a fixed order.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = "strata"

__all__ = [
    "build_wheel",
    "build_sdist",
    "build_editable",
    "get_requires_for_build_wheel",
    "get_requires_for_build_sdist",
    "get_requires_for_build_editable",
    "prepare_metadata_for_build_wheel",
    "prepare_metadata_for_build_editable",
]


def _project() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _name_version() -> tuple[str, str]:
    """The distribution name as it goes in file names (PEP 503 normalized,
    ``-`` as ``_``) and the version."""
    p = _project()
    return _file_name(p["name"]), p["version"]


def _file_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _epoch() -> int:
    try:
        return max(315532800, int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))
    except ValueError:
        return 315532800


def _metadata() -> str:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p.get('description', '')}",
        f"Requires-Python: {p.get('requires-python', '>=3.11')}",
    ]
    lic = p.get("license", {})
    if isinstance(lic, dict) and "text" in lic:
        lines.append(f"License: {lic['text']}")
    for c in p.get("classifiers", []):
        lines.append(f"Classifier: {c}")
    for d in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {d}")
    readme = ROOT / "README.md"
    if readme.exists():
        lines.append("Description-Content-Type: text/markdown")
        return "\n".join(lines) + "\n\n" + readme.read_text(encoding="utf-8")
    return "\n".join(lines) + "\n"


def _wheel_file() -> str:
    return "Wheel-Version: 1.0\nGenerator: strata_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _package_files() -> Iterator[tuple[str, Path]]:
    base = SRC / PACKAGE
    for path in sorted(base.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path.relative_to(SRC).as_posix(), path


def _hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _write_wheel(directory: str, files: list[tuple[str, bytes]]) -> str:
    name, version = _name_version()
    dist_info = f"{name}-{version}.dist-info"
    wheel_name = f"{name}-{version}-py3-none-any.whl"
    files = files + [
        (f"{dist_info}/METADATA", _metadata().encode()),
        (f"{dist_info}/WHEEL", _wheel_file().encode()),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode()),
    ]
    record_lines = [f"{arc},{_hash(data)},{len(data)}" for arc, data in files]
    record_lines.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record_lines) + "\n").encode()))
    stamp = time.gmtime(_epoch())[:6]
    with zipfile.ZipFile(Path(directory) / wheel_name, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in files:
            info = zipfile.ZipInfo(arc, date_time=stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return wheel_name


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    """Nothing: the backend needs only the standard library."""
    return []


def get_requires_for_build_sdist(config_settings: dict[str, Any] | None = None) -> list[str]:
    """Nothing: the backend needs only the standard library."""
    return []


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    """Nothing: the backend needs only the standard library."""
    return []


def _prepare_metadata(metadata_directory: str) -> str:
    name, version = _name_version()
    dist_info = Path(metadata_directory) / f"{name}-{version}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(_metadata(), encoding="utf-8")
    (dist_info / "WHEEL").write_text(_wheel_file(), encoding="utf-8")
    return dist_info.name


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    """Write the .dist-info directory (METADATA, WHEEL) and return its name."""
    return _prepare_metadata(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    """Write the .dist-info directory (METADATA, WHEEL) and return its name."""
    return _prepare_metadata(metadata_directory)


def build_wheel(wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None) -> str:
    """Build the pure-Python wheel into wheel_directory and return its file name."""
    files = [(arc, path.read_bytes()) for arc, path in _package_files()]
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None) -> str:
    """Build an editable wheel: a .pth file that puts src/ on sys.path."""
    return _write_wheel(wheel_directory, [(f"__editable__.{PACKAGE}.pth", (str(SRC) + "\n").encode())])


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    """Build the source distribution (.tar.gz with PKG-INFO) and return its file name."""
    name, version = _name_version()
    base = f"{name}-{version}"
    out = Path(sdist_directory) / f"{base}.tar.gz"
    members: list[Path] = [ROOT / "pyproject.toml", ROOT / "README.md", ROOT / "docs.sh"]
    for sub in ("_build", "src", "tests", "examples"):
        d = ROOT / sub
        if d.exists():
            members += [p for p in sorted(d.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    mtime = _epoch()

    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime = mtime
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755 if info.mode & 0o111 else 0o644
        info.pax_headers = {}
        return info

    # gzip's header holds a time and the file's name too: set both.
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for path in members:
                if path.exists():
                    tf.add(path, arcname=f"{base}/{path.relative_to(ROOT).as_posix()}", recursive=False, filter=normalize)
            pkg_info = _metadata().encode()
            info = normalize(tarfile.TarInfo(f"{base}/PKG-INFO"))
            info.size = len(pkg_info)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(pkg_info))
    return out.name
