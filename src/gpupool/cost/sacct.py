"""Slurm accounting (``sacct --parsable2``) as a trace for ``gpupool profile``.

Why Slurm: most teams moving to gpupool come from a Slurm cluster, and its accounting database
is the one record of what their work asked for and how long it waited. Export it with, e.g.::

    sacct --allusers --parsable2 --starttime 2026-01-01 \\
      --format=JobID,User,Account,Partition,Submit,Start,End,AllocTRES,State

The first line names the fields (any order, more fields allowed). One row per allocation is
kept; job steps (``123.batch``, ``123.0``, ``123.extern``) repeat their allocation and are
skipped. GPUs come from ``gres/gpu=N`` in AllocTRES (or the typed ``gres/gpu:MODEL=N`` entries,
summed; their model is reported, not required: Slurm's GPU type names are not gpupool's
models); ``node=N`` splits them into N pods when they divide evenly. A job whose AllocTRES is
empty (some Slurm versions, for a job that failed or was cancelled) is sized from ReqTRES when
the export has it. FAILED, CANCELLED and TIMEOUT jobs are replayed like the rest, their state
kept in ``observed``. Rows that never started, have not ended, or hold no GPU are counted, not
replayed (with the state of an unfinished job in the count's name). A malformed row is an
error naming the file, the line and the field.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gpupool.model import WorkloadType
from gpupool.sim.sources import JobSpec

REQUIRED = ("JobID", "Submit", "Start", "End", "AllocTRES", "State")
QUEUE_FIELDS = {"account": "Account", "user": "User", "partition": "Partition"}
#: a time Slurm could not give (the job never started, is still running, or the field is unset)
NO_TIME = {"", "unknown", "none", "n/a"}
STEP = re.compile(r"^\d+(?:[_+][\w\[\]-]+)?\.")  # 123.batch, 123_4.0, 123+1.extern
_TRES_GPU = re.compile(r"^gres/gpu(?::(?P<model>[^=]+))?$")
_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
MAX_ERRORS = 20


class SacctError(ValueError):
    """Malformed sacct rows, each located as ``FILE:LINE: field X: why``."""


@dataclass
class SacctTrace:
    """The replayable jobs, and what the export says beyond them (for the profile's tables)."""

    jobs: list[JobSpec] = field(default_factory=list)
    #: (queue, task type, GPU model, wait seconds, final Slurm state) of every replayed job
    observed: list[tuple[str, str, str, float, str]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class _Tres:
    gpus: int
    model: str
    nodes: int
    cpu_milli: int
    memory_mib: int


def parse_time(value: str, where: str, name: str) -> datetime | None:
    """Slurm's ``YYYY-MM-DDTHH:MM:SS`` (local time; only differences matter), None if unset."""
    if value.strip().lower() in NO_TIME:
        return None
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        raise SacctError(f"{where}: field {name}: {value!r} is not a time (YYYY-MM-DDTHH:MM:SS)") from None


def _memory_mib(value: str, where: str, name: str = "AllocTRES") -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", value.strip())
    if m is None:
        raise SacctError(f"{where}: field {name}: mem={value!r} is not a size (e.g. 64G)")
    return round(float(m[1]) * _MEM_UNITS[m[2] or "M"])


def parse_tres(value: str, where: str, name: str = "AllocTRES") -> _Tres:
    """``cpu=16,mem=64G,node=2,billing=16,gres/gpu=8`` (entries in any order)."""
    total: int | None = None
    typed, models = 0, []
    nodes, cpu, mem = 1, 0, 0
    for part in filter(None, (p.strip() for p in value.split(","))):
        key, sep, v = part.partition("=")
        if not sep:
            raise SacctError(f"{where}: field {name}: {part!r} is not KEY=VALUE")
        if key == "mem":
            mem = _memory_mib(v, where, name)
            continue
        g = _TRES_GPU.match(key)
        if key not in {"cpu", "node"} and g is None:
            continue  # billing, energy, license/...: not resources a pool holds
        if not v.isdigit():
            raise SacctError(f"{where}: field {name}: {key}={v!r} is not a whole number")
        if key == "cpu":
            cpu = int(v) * 1000
        elif key == "node":
            nodes = max(1, int(v))
        elif g is not None and g["model"] is None:
            total = int(v)
        elif g is not None:
            typed += int(v)
            models.append(g["model"])
    gpus = total if total is not None else typed
    return _Tres(gpus, models[0] if len(set(models)) == 1 else "", nodes, cpu, mem)


def _header(line: str, where: str) -> list[str]:
    names = [f.strip() for f in line.rstrip("\n").rstrip("|").split("|")]
    missing = [f for f in REQUIRED if f not in names]
    if missing:
        raise SacctError(
            f"{where}: header lacks {', '.join(missing)}: export with sacct --parsable2 "
            f"--format=JobID,User,Account,Partition,Submit,Start,End,AllocTRES,State"
        )
    return names


def _task_type(partition: str) -> WorkloadType:
    """A partition named after a task type (``inference``, ``fine-tuning`` ...) gives it;
    everything else is training, what most Slurm GPU work is."""
    try:
        return WorkloadType(partition.strip().lower())
    except ValueError:
        return WorkloadType.TRAINING


def load_sacct(path: Path, queue_by: str = "account") -> SacctTrace:
    """Read a ``sacct --parsable2`` export; raise :class:`SacctError` listing malformed rows."""
    if queue_by not in QUEUE_FIELDS:
        raise SacctError(f"--sacct-queue: {queue_by!r} is not one of {', '.join(QUEUE_FIELDS)}")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SacctError(f"--sacct: cannot read {path}: {exc.strerror}") from None
    return parse_sacct(text.splitlines(), str(path), queue_by)


def parse_sacct(lines: Iterable[str], source: str, queue_by: str = "account") -> SacctTrace:
    """The rows of an export (see :func:`load_sacct`), the header first."""
    it = iter(enumerate(lines, 1))
    header: list[str] | None = None
    for no, line in it:
        if line.strip():
            header = _header(line, f"{source}:{no}")
            break
    if header is None:
        raise SacctError(f"{source}: empty (no header line)")
    out, errors, rows = SacctTrace(), [], []
    for no, line in it:
        if not line.strip():
            continue
        where = f"{source}:{no}"
        values = line.rstrip("\n").split("|")
        if len(values) == len(header) + 1 and values[-1] == "":
            values.pop()  # --parsable (not 2) ends every row with a separator
        if len(values) != len(header):
            errors.append(f"{where}: {len(values)} fields, the header names {len(header)}")
            continue
        row = dict(zip(header, values, strict=True))
        try:
            rows.append(_row(row, where, QUEUE_FIELDS[queue_by], out.skipped))
        except SacctError as exc:
            errors.append(str(exc))
        if len(errors) >= MAX_ERRORS:
            break
    if errors:
        more = " (first ones only)" if len(errors) >= MAX_ERRORS else ""
        raise SacctError(f"{len(errors)} malformed sacct row(s){more}:\n" + "\n".join(errors))
    _as_jobs([r for r in rows if r is not None], out)
    return out


@dataclass(frozen=True, slots=True)
class _Row:
    job: str
    queue: str
    type: WorkloadType
    submit: datetime
    start: datetime
    end: datetime
    tres: _Tres
    state: str


def _row(row: dict[str, str], where: str, queue_field: str, skipped: Counter[str]) -> _Row | None:
    job = row["JobID"].strip()
    if not job:
        raise SacctError(f"{where}: field JobID: empty")
    if STEP.match(job):
        return None  # a step of an allocation listed on its own row
    submit = parse_time(row["Submit"], where, "Submit")
    start = parse_time(row["Start"], where, "Start")
    end = parse_time(row["End"], where, "End")
    state = row["State"].strip().split(" ")[0] or "UNKNOWN"  # "CANCELLED by 1234"
    tres = _tres(row, where)
    if submit is None:
        raise SacctError(f"{where}: field Submit: missing")
    if start is None or end is None:
        skipped[_why("never started" if start is None else "still running", state)] += 1
        return None
    if end < start or start < submit:
        raise SacctError(
            f"{where}: field End: times out of order (Submit {submit}, Start {start}, End {end})"
        )
    if tres.gpus <= 0:
        skipped[_why("no GPU", state)] += 1
        return None
    queue = (row.get(queue_field) or "").strip() or (row.get("User") or "").strip() or "default"
    return _Row(job, queue, _task_type(row.get("Partition", "")), submit, start, end, tres, state)


#: states of work that ended without completing: kept and replayed, their state reported
UNFINISHED = frozenset({"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"})


def _why(reason: str, state: str) -> str:
    """A skip reason that names an unfinished job's state, so none disappears unsaid."""
    return f"{reason}, {state}" if state in UNFINISHED else reason


def _tres(row: dict[str, str], where: str) -> _Tres:
    """What the job held (AllocTRES), else what it asked for (ReqTRES, where exported): some
    Slurm versions leave AllocTRES empty for a job that failed or was cancelled while running,
    which read as "no GPU" and dropped it."""
    tres = parse_tres(row["AllocTRES"], where)
    if tres.gpus <= 0 and (row.get("ReqTRES") or "").strip():
        tres = parse_tres(row["ReqTRES"], where, "ReqTRES")
    return tres


def _as_jobs(rows: list[_Row], out: SacctTrace) -> None:
    if not rows:
        return
    t0 = min(r.submit for r in rows)
    for r in rows:
        t = r.tres
        pods = t.nodes if t.nodes > 1 and t.gpus % t.nodes == 0 else 1
        out.jobs.append(
            JobSpec(
                f"slurm-{r.job}",
                r.queue,
                (r.submit - t0).total_seconds(),
                max(1.0, (r.end - r.start).total_seconds()),
                gpus=t.gpus // pods,
                replicas=pods,
                cpu_milli=t.cpu_milli // pods,
                memory_mib=t.memory_mib // pods,
                type=r.type,
                source="sacct",
            )
        )
        wait = (r.start - r.submit).total_seconds()
        out.observed.append((r.queue, str(r.type), t.model, wait, r.state))
    order = sorted(range(len(out.jobs)), key=lambda i: out.jobs[i].submit)
    out.jobs = [out.jobs[i] for i in order]
    out.observed = [out.observed[i] for i in order]


__all__ = ["SacctError", "SacctTrace", "load_sacct", "parse_sacct", "parse_tres"]
