"""Reading manifest files for every CLI command that takes ``-f``: one loader, one validator.

Why: a binary or Latin-1 file must be one clear line, not a ``UnicodeDecodeError`` traceback;
and a set of manifests is checked whole, with the server's own validator
(:func:`gpupool.manifests.parse_documents`), before anything is sent, so a bad document or a
duplicate name never leaves half of a set applied.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from gpupool.manifests import (
    Bundle,
    Document,
    ManifestError,
    build,
    collect_documents,
    default_priority_classes,
)

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"


class FileProblem(Exception):
    """A file that cannot be used at all (missing, unreadable, not UTF-8): one line, exit 2."""


def decode_utf8(data: bytes, source: str) -> str:
    """UTF-8 text, or FileProblem naming the first bad byte and its offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(
            f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def read_text(path: Path) -> str:
    """A file's (or stdin's, for ``-``) text; FileProblem when it cannot be read or decoded."""
    if str(path) == STDIN:
        return decode_utf8(sys.stdin.buffer.read(), "<stdin>")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FileProblem(f"{path}: cannot read: {exc.strerror}") from None
    return decode_utf8(data, str(path))


def expand(files: Iterable[Path]) -> list[Path]:
    """Files as given, directories walked in name order for manifest suffixes; ``-`` is stdin."""
    paths: list[Path] = []
    for f in files:
        if str(f) == STDIN:
            paths.append(f)
        elif f.is_dir():
            paths += sorted(p for p in f.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
        elif f.exists():
            paths.append(f)
        else:
            raise FileProblem(f"{f}: no such file or directory")
    return paths


def load_documents(files: Iterable[Path]) -> list[Document]:
    """Every document of every file, validated; ManifestError lists every located problem.

    Duplicates (same kind and name) are refused across files as well as within one, since the
    set is applied as one: a second copy would either change nothing or conflict.
    """
    given = list(files)
    docs: list[Document] = []
    errors: list[str] = []
    for p in expand(given):
        source = "<stdin>" if str(p) == STDIN else str(p)
        got, bad = collect_documents(read_text(p), source)
        docs.extend(got)
        errors.extend(bad)
    errors += _duplicates(docs)
    if errors:
        # the documents that parsed are converted too: every problem in one round
        try:
            build(docs, Bundle(priority_classes=list(default_priority_classes())), references=False)
        except ManifestError as exc:
            errors.extend(exc.errors)
        raise ManifestError(errors)
    if not docs:
        raise FileProblem("no manifests found in " + ", ".join(map(str, given)))
    return docs


def _duplicates(docs: list[Document]) -> list[str]:
    seen: dict[tuple[str, str], str] = {}
    out = []
    for d in docs:
        key = (d.kind, d.name)
        first = seen.setdefault(key, d.source)
        if first != d.source:
            out.append(f"{d.source}: metadata.name: duplicate {d.kind} {d.name!r} (first in {first})")
    return out
