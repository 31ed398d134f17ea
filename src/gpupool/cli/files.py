"""Reading manifest files for every CLI command that takes ``-f``: one loader, one validator.

Why: a binary or Latin-1 file must be one clear line, not a ``UnicodeDecodeError`` traceback;
and a set of manifests is checked whole, with the server's own validator
(:func:`gpupool.manifests.parse_documents`), before anything is sent, so a bad document or a
duplicate name never leaves half of a set applied.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from gpupool.cli.checks import Known, merge, reference_problems, with_hints
from gpupool.cli.kubeobjects import is_kube_object, to_workload
from gpupool.manifests import (
    Bundle,
    Document,
    ManifestError,
    build,
    collect_documents,
    default_priority_classes,
    safe_yaml,
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


def load_documents(files: Iterable[Path], known: Known | None = None) -> list[Document]:
    """Every document of every file, validated; ManifestError lists every located problem.

    ``known`` (the names a server has) makes references to queues, pools and priority classes
    checked in the same round, each unknown name with the nearest known one. Kubernetes
    objects (a Job with Kueue's queue label) are read as the Workloads they become.

    Duplicates (same kind and name) are refused across files as well as within one, since the
    set is applied as one: a second copy would either change nothing or conflict.
    """
    given = list(files)
    docs: list[Document] = []
    errors: list[str] = []
    raws: list[tuple[str, dict[str, Any]]] = []
    for p in expand(given):
        source = "<stdin>" if str(p) == STDIN else str(p)
        text, converted, bad_kube = _converted(read_text(p), source)
        raws += converted
        got, bad = collect_documents(text, source)
        docs.extend(got)
        errors.extend(bad_kube + bad)
    errors += _duplicates(docs)
    if errors or known is not None:
        errors = _one_round(docs, raws, errors, known)
    if errors:
        raise ManifestError(with_hints(sorted(errors, key=_document_order), _known_of(docs, known)))
    if not docs:
        raise FileProblem("no manifests found in " + ", ".join(map(str, given)))
    return docs


def _document_order(problem: str) -> tuple[str, int]:
    """Problems in file and document order, whichever check found them."""
    m = re.match(r"(.*?): document (\d+)", problem)
    return (m[1], int(m[2])) if m else (problem.split(":", 1)[0], 0)


def _converted(text: str, source: str) -> tuple[str, list[tuple[str, dict[str, Any]]], list[str]]:
    """The text with each Kubernetes object replaced by its Workload; the documents; the problems.

    Why rewrite the text: the documents keep their numbers, so every problem still names the
    document the user wrote."""
    try:
        raw_docs = [d for d in safe_yaml.load_all(text) if d is not None]
    except yaml.YAMLError:
        return text, [], []  # collect_documents reports where the YAML breaks
    out: list[Any] = []
    labelled: list[tuple[str, dict[str, Any]]] = []
    problems: list[str] = []
    for n, raw in enumerate(raw_docs, start=1):
        raw = read_back(raw)
        if is_kube_object(raw):
            manifest, problem = to_workload(raw)
            if problem is not None:
                md = raw.get("metadata") or {}
                problems.append(
                    f"{source}: document {n} ({raw.get('kind')}/{md.get('name', '?')}): {problem}"
                )
                continue
            raw = manifest
        out.append(raw)
        if isinstance(raw, dict):
            md = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
            here = f"{source}: document {n} ({raw.get('kind') or '?'}/{(md or {}).get('name') or '?'})"
            labelled.append((here, raw))
    as_written = not any(is_kube_object(r) or read_back(r) is not r for r in raw_docs)
    if not problems and len(labelled) == len(raw_docs) and as_written:
        return text, labelled, []
    return yaml.safe_dump_all(out, sort_keys=False), labelled, problems


def read_back(raw: Any) -> Any:
    """A workload as ``gpupool get workload NAME -o yaml|json`` printed it (its view: phase,
    placement and the rest of the status around the submitted ``manifest``) is its manifest;
    anything else is returned as it is.

    Why: so that what ``get`` prints applies back, as kubectl's objects do; the status is the
    server's and is ignored, as ``status`` is on every other kind."""
    if isinstance(raw, dict) and "apiVersion" not in raw and "seq" in raw:
        manifest = raw.get("manifest")
        if isinstance(manifest, dict) and manifest.get("kind") == "Workload":
            return manifest
    return raw


def _known_of(docs: list[Document], known: Known | None) -> Known:
    """The names the set may refer to: the server's (when asked), the built-ins, the set's own."""
    k = Known(set(known.queues), set(known.pools), set(known.classes)) if known else Known()
    for d in docs:
        k.add(d.kind, d.name)
    return k


def _one_round(
    docs: list[Document], raws: list[tuple[str, dict[str, Any]]], errors: list[str], known: Known | None
) -> list[str]:
    """Every problem of the set at once: each document's own, then the names nothing defines."""
    names = _known_of(docs, known)
    try:
        # the documents that parsed are converted too, checked against the names known
        base = Bundle(priority_classes=list(default_priority_classes()))
        build(docs, base, references=False)
    except ManifestError as exc:
        errors = errors + list(exc.errors)
    for _src, raw in raws:  # names defined by documents that failed still count as defined
        md = raw.get("metadata")
        if isinstance(md, dict) and isinstance(md.get("name"), str):
            names.add(str(raw.get("kind")), md["name"])
    if known is None and not names.queues - Known().queues:
        names.queues = set()  # no queue in the set and no server asked: nothing to check against
    return merge(errors, reference_problems(raws, names))


def _duplicates(docs: list[Document]) -> list[str]:
    seen: dict[tuple[str, str], str] = {}
    out = []
    for d in docs:
        key = (d.kind, d.name)
        first = seen.setdefault(key, d.source)
        if first != d.source:
            out.append(f"{d.source}: metadata.name: duplicate {d.kind} {d.name!r} (first in {first})")
    return out
