"""Reading manifests: YAML text and files to validated documents, with every problem located.

A file is accepted whole or rejected whole: every error in every document is collected and
reported as ``file: document N (Kind/name): field.path: problem`` so nothing is half-applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gpupool.manifests import safe_yaml
from gpupool.manifests.base import API_VERSION, KINDS, Document, ManifestError, Metadata
from gpupool.manifests.cluster import ClusterSpec, PoolSpec
from gpupool.manifests.queues import PriorityClassSpec, QueueSpec
from gpupool.manifests.workloads import WorkloadSpec

#: characters no store backend can keep in text (PostgreSQL refuses NUL; UTF-8 has no lone surrogates)
_UNSTORABLE = {chr(0)} | {chr(c) for c in range(0xD800, 0xE000)}
MAX_TEXT_DEPTH = 32

#: metadata the server sets and ``gpupool get`` prints (kubectl's names): accepted back on
#: apply so that what ``get -o yaml`` printed applies unchanged, never stored
SERVER_METADATA = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields")

SPECS: dict[str, type[BaseModel]] = {
    "Cluster": ClusterSpec,
    "ResourcePool": PoolSpec,
    "Queue": QueueSpec,
    "PriorityClass": PriorityClassSpec,
    "Workload": WorkloadSpec,
}


def _loc(parts: Iterable[object]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


def parse_documents(text: str, source: str = "<input>") -> list[Document]:
    """Parse and validate YAML text; raises ManifestError listing every problem."""
    docs, errors = collect_documents(text, source)
    if errors:
        raise ManifestError(errors)
    return docs


def collect_documents(text: str, source: str = "<input>") -> tuple[list[Document], list[str]]:
    """The valid documents of a YAML text and the located problems of the others.

    Why both: a caller that reports problems can then also convert the valid documents and
    report their problems (quantities, durations) in the same round, instead of one round per
    kind of mistake."""
    errors: list[str] = []
    try:
        raw_docs = [d for d in safe_yaml.load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return [], [f"{source}:{where}: invalid YAML: {problem}"]
    docs: list[Document] = []
    for n, raw in enumerate(raw_docs, start=1):
        doc = validate_document(raw, f"{source}: document {n}", errors)
        if doc is not None:
            docs.append(doc)
    seen: dict[tuple[str, str], str] = {}
    for d in docs:
        key = (d.kind, d.name)
        if key in seen:
            errors.append(f"{d.source}: metadata.name: duplicate {d.kind} {d.name!r} (first in {seen[key]})")
        seen[key] = d.source
    return docs, errors


def unstorable_text(value: Any, path: str = "", depth: int = 0) -> tuple[str, str] | None:
    """The first string (key or value) a store cannot keep, as ``(field path, problem)``.

    Why: PostgreSQL refuses NUL in text and no encoder takes a lone surrogate; such a value
    must be refused when it is validated, never discovered by a failing transaction (one such
    workload once made the server unable to restart)."""
    if depth > MAX_TEXT_DEPTH:
        return path or "body", f"nested more than {MAX_TEXT_DEPTH} levels deep"
    if isinstance(value, str):
        bad = next((c for c in value if c in _UNSTORABLE), None)
        if bad is not None:
            what = "a NUL character" if bad == chr(0) else f"an unpaired surrogate U+{ord(bad):04X}"
            return path or "body", f"contains {what}, which cannot be stored"
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            hit = unstorable_text(k, path or "body", depth + 1) if isinstance(k, str) else None
            hit = hit or unstorable_text(v, here, depth + 1)
            if hit:
                return hit
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            hit = unstorable_text(v, f"{path}[{i}]", depth + 1)
            if hit:
                return hit
    return None


def validate_document(raw: Any, here: str, errors: list[str]) -> Document | None:
    """Check one manifest (a parsed YAML or JSON mapping); append located errors, or return it.

    The one validator for files (``gpupool validate``) and the API, so both accept and refuse
    the same manifests with the same messages."""
    if not isinstance(raw, dict):
        errors.append(f"{here}: expected a mapping with apiVersion, kind, metadata and spec")
        return None
    kind = raw.get("kind")
    md = raw.get("metadata")
    name = md.get("name") if isinstance(md, dict) else None
    ident = f"{here} ({kind if isinstance(kind, str) and kind else '?'}/{name if isinstance(name, str) and name else '?'})"
    bad = unstorable_text(raw)
    if bad is not None:
        errors.append(f"{ident}: {bad[0]}: {bad[1]}")
        return None
    if raw.get("apiVersion") != API_VERSION:
        errors.append(f"{ident}: apiVersion: must be {API_VERSION!r}, got {raw.get('apiVersion')!r}")
    if kind not in SPECS:
        errors.append(f"{ident}: kind: must be one of {', '.join(KINDS)}, got {kind!r}")
        return None
    for k in sorted(str(x) for x in set(raw) - {"apiVersion", "kind", "metadata", "spec", "status"}):
        errors.append(f"{ident}: {k}: unknown top-level field")
    if md is not None and not isinstance(md, dict):
        errors.append(f"{ident}: metadata: must be a mapping with at least a name")
        return None
    before = len(errors)
    meta = _validated(Metadata, person_metadata(md or {}, ident, errors), "metadata", ident, errors)
    spec_raw = raw.get("spec")
    spec = None
    if spec_raw is not None and not isinstance(spec_raw, dict):
        errors.append(f"{ident}: spec: must be a mapping")
    else:  # checked even when the metadata is bad: every problem is reported in one round
        spec = _validated(SPECS[str(kind)], spec_raw or {}, "spec", ident, errors)
    if meta is None or spec is None or len(errors) > before:
        return None
    return Document(str(kind), meta.name, meta, spec, raw, ident)


def expected_version(value: Any) -> int | None:
    """A ``metadata.resourceVersion`` as the stored version it expects (None: not one the
    server could have returned: digits, as text or a number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 0 <= value < 2**63:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        return int(value)
    return None


def person_metadata(md: Mapping[str, Any], ident: str, errors: list[str]) -> dict[str, Any]:
    """The metadata a person writes: without :data:`SERVER_METADATA`.

    Why here, in the one validator: an object ``gpupool get -o yaml`` printed must pass
    ``gpupool validate`` and the client's own check before ``apply``, as it passes the server's;
    the model stays strict about every other field. A resourceVersion the server could not have
    returned is a located error rather than being ignored (it is a precondition on apply)."""
    rv = md.get("resourceVersion")
    if rv is not None and expected_version(rv) is None:
        errors.append(
            f"{ident}: metadata.resourceVersion: must be the resourceVersion a GET returned "
            f"(digits), got {rv!r}"
        )
    return {k: v for k, v in md.items() if k not in SERVER_METADATA}


def _validated(model: type[Any], value: Any, prefix: str, ident: str, errors: list[str]) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        errors.extend(
            f"{ident}: {_loc([prefix, *e['loc']])}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        return None


def load_files(paths: Iterable[Path]) -> list[Document]:
    """Load every YAML file (directories are walked in name order); all-or-nothing across files."""
    docs: list[Document] = []
    errors: list[str] = []
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(x for x in p.rglob("*") if x.suffix in (".yaml", ".yml")))
        else:
            files.append(p)
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as exc:
            errors.append(f"{f}: cannot read: {exc.strerror or exc}")
            continue
        try:
            docs.extend(parse_documents(text, str(f)))
        except ManifestError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ManifestError(errors)
    return docs
