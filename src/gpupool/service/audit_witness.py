"""The automatic audit witness: signed checkpoints taken by the server itself, kept outside the database.

Why: the store's anchor lives in the database it protects, so a writer with SQL access who
rewrites a record and recomputes the chain and the anchor (or deletes the tail, or wipes the
table) passes ``verify``. A checkpoint (count, head hash) signed with a key the database does
not hold, and written where the database cannot write, proves the prefix unchanged (see
:mod:`gpupool.audit_checkpoint`). Checkpoints taken by hand are rarely taken; this module takes
them on a schedule, at start and at shutdown, on the leader only (one writer of the witness).

Before signing, the witness checks the chain against the newest checkpoint it holds: a chain
rewritten since is never signed (that would launder the rewrite), and the newest checkpoint
stays the one taken before it. Records written after the newest checkpoint are protected by
the anchor only until the next one.

Where checkpoints go (a :class:`WitnessSink`): a file (append-only JSON lines, fsync after each),
an HTTP endpoint (POST one checkpoint; GET answers the checkpoints, one JSON object or one per
line), or a Kubernetes ConfigMap (one key per checkpoint, in a namespace of its own).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpupool import audit_checkpoint as ckpt
from gpupool.audit import VerifyResult, canonical_json
from gpupool.quantity import QuantityError, parse_duration
from gpupool.store import Store

log = logging.getLogger(__name__)

#: where ``gpupool serve`` puts the witness and its key when not told (both under --state-dir)
DEFAULT_FILE = "audit-witness.jsonl"
DEFAULT_KEY = "audit-witness.key"
#: the --audit-witness prefix that names a ConfigMap
CONFIGMAP = "configmap://"
#: how much of a witness file's end is read to find its newest checkpoint (a line is ~300 bytes)
_TAIL_BYTES = 64 * 1024


class WitnessError(RuntimeError):
    """The witness cannot be read or written; the message names where and why."""


@dataclass(frozen=True)
class WitnessSettings:
    """``gpupool serve --audit-witness TARGET --audit-key KEY --audit-checkpoint-every DURATION``."""

    #: a file path, or an http:// or https:// URL
    target: str
    #: the Ed25519 private key (``gpupool audit keygen``) that signs every checkpoint
    key_path: Path
    #: seconds between scheduled checkpoints (one is also taken at start and at shutdown)
    every_s: float = 600.0
    #: how often a standby looks again whether it leads (the lease's retry interval)
    retry_s: float = 1.0
    #: the key was made at this start (the banner says so: its .pub is needed to verify)
    key_generated: bool = False
    #: makes the Kubernetes client a configmap:// target writes with, on first use; given by
    #: the caller (``gpupool serve``: ``gpupool.kube.client.make_client``) so that the service
    #: does not import the Kubernetes adapter above it
    kube_client: Callable[[], Any] | None = field(default=None, compare=False, repr=False)


class WitnessSink(Protocol):
    """Somewhere the database cannot rewrite: checkpoints are added, the newest read back."""

    where: str

    def append(self, cp: ckpt.Checkpoint) -> None: ...

    def newest(self) -> dict[str, Any] | None: ...


class FileSink:
    """Append-only JSON lines; each line written with one ``write`` under O_APPEND, then fsync."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)

    def append(self, cp: ckpt.Checkpoint) -> None:
        line = (canonical_json(cp.to_dict()) + "\n").encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise WitnessError(f"{self.path}: cannot write: {exc.strerror}") from exc

    def newest(self) -> dict[str, Any] | None:
        try:
            with self.path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - _TAIL_BYTES))
                tail = f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise WitnessError(f"{self.path}: cannot read: {exc.strerror}") from exc
        lines = [line for line in tail.splitlines() if line.strip()]
        if not lines:
            return None
        try:
            return ckpt.read_checkpoints(lines[-1])[-1]
        except ckpt.CheckpointError as exc:
            raise WitnessError(f"{self.path}: last line: {exc}") from exc


class HttpSink:
    """POST each checkpoint (retried on transport errors and 5xx); GET reads them back."""

    def __init__(
        self,
        url: str,
        *,
        attempts: int = 3,
        backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.where = url
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._client = httpx.Client(timeout=10.0, transport=transport)

    def _send(self, method: str, **kw: Any) -> httpx.Response:
        problem = ""
        for n in range(self.attempts):
            if n:
                time.sleep(self.backoff_s * 2 ** (n - 1))
            try:
                r = self._client.request(method, self.where, **kw)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if r.status_code < 500:
                return r
            problem = f"answered {r.status_code}"
        raise WitnessError(f"{self.where}: {method} failed after {self.attempts} attempts: {problem}")

    def append(self, cp: ckpt.Checkpoint) -> None:
        r = self._send("POST", json=cp.to_dict())
        if r.status_code >= 300:
            raise WitnessError(f"{self.where}: POST answered {r.status_code}: {r.text[:200]}")

    def newest(self) -> dict[str, Any] | None:
        r = self._send("GET")
        if r.status_code == 404 or (r.status_code < 300 and not r.text.strip()):
            return None
        if r.status_code >= 300:
            raise WitnessError(f"{self.where}: GET answered {r.status_code}: {r.text[:200]}")
        try:
            items = ckpt.read_checkpoints(r.text)
        except ckpt.CheckpointError as exc:
            raise WitnessError(f"{self.where}: {exc}") from exc
        return max(items, key=lambda c: c.get("count", -1) if isinstance(c.get("count"), int) else -1)


class ConfigMapSink:
    """A ConfigMap (``configmap://NAMESPACE/NAME``), best in a namespace the database's operators
    cannot write: one key per checkpoint (``cp-`` and the count, zero-padded so keys sort by
    count), merge-patched in; the oldest beyond ``keep`` are dropped in the same patch, so the
    object stays far below the 1 MiB a ConfigMap may hold (only the newest is ever needed).

    The client is made on first use by ``make_client`` (``gpupool.kube.client.make_client``: the
    kubeconfig, else the pod's service account), so an API server away at start is a failed
    pass, retried, not a failed start."""

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        keep: int = 200,
        client: Any = None,
        make_client: Callable[[], Any] | None = None,
    ) -> None:
        self.namespace, self.name, self.keep = namespace, name, keep
        self.where = f"{CONFIGMAP}{namespace}/{name}"
        self._client, self._make_client = client, make_client

    def _api(self) -> Any:
        if self._client is None:
            if self._make_client is None:
                raise WitnessError(f"{self.where}: no Kubernetes client given to make one with")
            self._client = self._make_client()
        return self._client

    def _get(self) -> Any:
        """The ConfigMap, or None when it does not exist yet."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import ConfigMap

        try:
            return self._api().get(ConfigMap, self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise WitnessError(f"{self.where}: {exc.status.code} {exc.status.message}") from exc
        except Exception as exc:  # no kubeconfig, the server away: named, the pass retried
            raise WitnessError(f"{self.where}: cannot read: {type(exc).__name__}: {exc}") from exc

    def append(self, cp: ckpt.Checkpoint) -> None:
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import ConfigMap
        from lightkube.types import PatchType

        key, value = f"cp-{cp.count:020d}", canonical_json(cp.to_dict())
        cm = self._get()
        try:
            if cm is None:
                meta = ObjectMeta(name=self.name, namespace=self.namespace)
                self._api().create(ConfigMap(metadata=meta, data={key: value}))
                return
            old = sorted(k for k in (cm.data or {}) if k.startswith("cp-") and k != key)
            drop = {k: None for k in old[: max(0, len(old) + 1 - self.keep)]}
            patch = {"data": {**drop, key: value}}
            self._api().patch(
                ConfigMap, self.name, patch, namespace=self.namespace, patch_type=PatchType.MERGE
            )
        except Exception as exc:
            raise WitnessError(f"{self.where}: cannot write: {type(exc).__name__}: {exc}") from exc

    def newest(self) -> dict[str, Any] | None:
        cm = self._get()
        keys = sorted(k for k in ((cm.data or {}) if cm is not None else {}) if k.startswith("cp-"))
        if not keys:
            return None
        try:
            return ckpt.read_checkpoints(cm.data[keys[-1]])[-1]
        except ckpt.CheckpointError as exc:
            raise WitnessError(f"{self.where}: key {keys[-1]}: {exc}") from exc


def sink_for(target: str, *, kube_client: Callable[[], Any] | None = None) -> WitnessSink:
    """A URL is an HTTP endpoint, ``configmap://NAMESPACE/NAME`` a ConfigMap (its client made
    with ``kube_client`` on first use), anything else a file."""
    if target.startswith(("http://", "https://")):
        return HttpSink(target)
    if target.startswith(CONFIGMAP):
        namespace, _, name = target.removeprefix(CONFIGMAP).partition("/")
        if not namespace or not name or "/" in name:
            raise ValueError(f"--audit-witness {target!r}: a ConfigMap is configmap://NAMESPACE/NAME")
        return ConfigMapSink(namespace, name, make_client=kube_client)
    return FileSink(Path(target))


def prepare_key(path: Path, *, generate: bool) -> tuple[Ed25519PrivateKey, bool]:
    """The signing key and whether it was made now. Generated (mode 0600, KEY.pub beside it) only
    when ``generate`` (the default path under the state directory); an operator who names a key
    expects it to exist, so a missing one is refused (CheckpointError naming the file)."""
    if not path.exists():
        if not generate:
            raise ckpt.CheckpointError(
                f"{path}: no such key; make one with `gpupool audit keygen --out {path}`"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        ckpt.generate_key(path)
        return ckpt.load_private_key(path), True
    return ckpt.load_private_key(path), False


def settings_from_options(
    every: str, target: str | None, key: Path | None, state_dir: Path
) -> WitnessSettings | None:
    """``gpupool serve``'s --audit-checkpoint-every/--audit-witness/--audit-key (None: off).

    Raises ValueError naming the option."""
    if every.strip().lower() == "off":
        for opt, v in (("--audit-witness", target), ("--audit-key", key)):
            if v is not None:
                raise ValueError(
                    f"{opt} needs the witness on: --audit-checkpoint-every {every!r} turns it off"
                )
        return None
    try:
        every_s = parse_duration(every)
    except QuantityError as exc:
        raise ValueError(f"--audit-checkpoint-every {every!r}: {exc}") from None
    if every_s <= 0:
        raise ValueError(f"--audit-checkpoint-every {every!r}: must be > 0 (or off)")
    if target is not None and not target.strip():
        raise ValueError("--audit-witness: give a file path, an http(s):// URL or configmap://NAMESPACE/NAME")
    if target is not None:
        sink_for(target)  # a malformed configmap:// target is named now, not at the first pass
    return WitnessSettings(target or str(state_dir / DEFAULT_FILE), key or state_dir / DEFAULT_KEY, every_s)


def prepare(settings: WitnessSettings, *, generate: bool) -> WitnessSettings:
    """The settings once their key is usable (made now when ``generate`` and absent: see
    :func:`prepare_key`). Raises ValueError naming --audit-key."""
    try:
        _, made = prepare_key(settings.key_path, generate=generate)
    except (ckpt.CheckpointError, OSError) as exc:
        raise ValueError(f"--audit-key: {exc}") from None
    return replace(settings, key_generated=made)


def _duration(seconds: float) -> str:
    """A duration as it was likely written: 10m, 1h, 90s."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{seconds / n:g}{unit}"
    return f"{seconds:g}s"


def banner_line(settings: WitnessSettings | None) -> str:
    """What ``gpupool serve`` prints about the witness: where, how often, which key."""
    if settings is None:
        return "audit witness: off (--audit-checkpoint-every off); take checkpoints with `gpupool audit checkpoint`"
    kid = ckpt.key_id(ckpt.load_private_key(settings.key_path).public_key())
    made_now = f"generated {settings.key_path} (mode 0600) now; " if settings.key_generated else ""
    return (
        f"audit witness: signed checkpoints every {_duration(settings.every_s)} and at shutdown to "
        f"{settings.target} ({made_now}key id {kid}; verify with {ckpt.public_key_path(settings.key_path)})"
    )


class AuditWitness:
    """Takes signed checkpoints of the store's chain into a sink; see the module docstring."""

    def __init__(
        self,
        store: Store,
        sink: WitnessSink,
        key: Ed25519PrivateKey,
        *,
        server: str,
        every_s: float = 600.0,
        retry_s: float = 1.0,
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store, self.sink, self.server = store, sink, server
        self.every_s, self.retry_s, self.is_leader = every_s, retry_s, is_leader
        self._key, self._public = key, key.public_key()
        self.key_id = ckpt.key_id(self._public)
        #: why the last pass signed nothing (a rewritten chain, an unreachable sink), else ""
        self.last_error = ""
        self._written: ckpt.Checkpoint | None = None  # the newest this process wrote
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def newest(self) -> ckpt.Checkpoint | None:
        """The newest checkpoint in the sink, its signature checked with this witness's key.

        Raises WitnessError when it cannot be read, does not verify, or is older than one this
        process wrote (the witness itself was cut back)."""
        data = self.sink.newest()
        cp = None
        if data is not None:
            try:
                cp = ckpt.check(data, self._public)
            except ckpt.CheckpointError as exc:
                raise WitnessError(f"{self.sink.where}: newest checkpoint: {exc}") from exc
        mine = self._written
        if mine is not None and (cp is None or cp.count < mine.count):
            have = "none" if cp is None else f"seq {cp.count}"
            raise WitnessError(
                f"{self.sink.where}: newest checkpoint is {have}, but this server wrote one of seq "
                f"{mine.count} at {mine.at}: the witness was cut back"
            )
        return cp

    def verify(self) -> tuple[VerifyResult, ckpt.Checkpoint | None]:
        """The store's chain verified against the newest checkpoint (what ``/v1/audit/verify``
        answers by default); a witness that cannot be read fails verification, naming it."""
        try:
            cp = self.newest()
        except WitnessError as exc:
            count, head = self.store.audit_head()
            return VerifyResult(False, count, head, None, f"audit witness: {exc}"), None
        r = self.store.verify_audit(checkpoint=None if cp is None else (cp.count, cp.head_hash))
        if not r.ok and cp is not None:
            note = f" (checked against the witness checkpoint of seq {cp.count} taken {cp.at} in {self.sink.where})"
            r = replace(r, problem=r.problem + note)
        return r, cp

    def take_now(self) -> ckpt.Checkpoint | None:
        """One checkpoint, if this replica leads and the chain holds against the newest one.

        Returns the newest checkpoint after the pass (unchanged when nothing was appended since),
        or None when nothing was taken; a refusal is logged and kept in ``last_error``."""
        if not self.is_leader():
            return None
        with self._mu:
            r, prev = self.verify()
            if not r.ok:
                at = "" if r.first_bad_seq is None else f" (audit log broken at seq {r.first_bad_seq})"
                self.last_error = f"not signed{at}: {r.problem}"
                log.error("audit witness: %s", self.last_error)
                return None
            self.last_error = ""
            if r.count == 0 or (prev is not None and (prev.count, prev.head_hash) == (r.count, r.head_hash)):
                return prev
            cp = ckpt.sign(self._key, count=r.count, head_hash=r.head_hash, server=self.server)
            self.sink.append(cp)
            self._written = cp
            return cp

    def start(self) -> None:
        """Take one at once (or as soon as this replica leads), then every ``every_s``."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpupool-audit-witness", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the schedule and take the shutdown checkpoint (while this replica still leads)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._pass("at shutdown")

    def _pass(self, when: str) -> bool:
        try:
            self.take_now()
            return True
        except Exception as exc:  # the loop outlives an unreachable sink or database
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("audit witness %s: %s", when, self.last_error)
            return False

    def _run(self) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            ok = self._pass("scheduled")
            if not self.is_leader():  # a standby looks again as often as it tries the lease
                wait = min(self.retry_s, self.every_s)
            else:  # a failed pass (sink or database away) is retried sooner than the schedule
                wait = self.every_s if ok else self.every_s / 10


def start_witness(
    store: Store, settings: WitnessSettings | None, *, server: str, is_leader: Callable[[], bool]
) -> AuditWitness | None:
    """The witness ``gpupool serve`` configured, started; None when it is off."""
    if settings is None:
        return None
    key = ckpt.load_private_key(settings.key_path)
    w = AuditWitness(
        store,
        sink_for(settings.target, kube_client=settings.kube_client),
        key,
        server=server,
        every_s=settings.every_s,
        retry_s=settings.retry_s,
        is_leader=is_leader,
    )
    w.start()
    return w


def witness_of(app_state: Any) -> AuditWitness | None:
    """The app's witness (``app.state.audit_witness``), if one runs."""
    found = getattr(app_state, "audit_witness", None)
    return found if isinstance(found, AuditWitness) else None
