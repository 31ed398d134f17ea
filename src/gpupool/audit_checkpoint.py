"""Signed audit checkpoints: an external witness of the audit chain's head.

Why: the store's anchor (count, head hash) lives in the same database as the chain, so a
writer who rewrites records and recomputes the chain and the anchor passes ``verify``. A
checkpoint records (count, head hash) at a moment, signed with an Ed25519 key that only the
operator holds (never the server or the database), and is kept outside the database (a file
or an append-only checkpoint log). Later, record ``count`` must still have that hash: new
records may follow it, but rewriting any record at or before it changes that hash.

This module is pure apart from key files: signing, checking and (de)serialising checkpoints.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gpupool.audit import canonical_json, format_time

# Domain separation: a signature over a checkpoint cannot be replayed as any other signed text.
SIGNING_CONTEXT = b"gpupool-audit-checkpoint-v1\n"
SIGNED_FIELDS = ("count", "headHash", "at", "server", "keyId")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class CheckpointError(ValueError):
    """A key or checkpoint that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Checkpoint:
    """One signed witness: record ``count`` of the chain had hash ``head_hash`` at time ``at``."""

    count: int
    head_hash: str
    at: str
    server: str
    key_id: str
    signature: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written to files and checkpoint logs."""
        return {
            "count": self.count,
            "headHash": self.head_hash,
            "at": self.at,
            "server": self.server,
            "keyId": self.key_id,
            "signature": self.signature,
        }

    def signed_bytes(self) -> bytes:
        """What the signature covers: every field but the signature, as canonical JSON."""
        body = {k: v for k, v in self.to_dict().items() if k in SIGNED_FIELDS}
        return SIGNING_CONTEXT + canonical_json(body).encode("utf-8")


def public_key_path(private_path: Path) -> Path:
    """The public key lives beside the private one: KEY -> KEY.pub."""
    return private_path.with_name(private_path.name + ".pub")


def key_id(public: Ed25519PublicKey) -> str:
    """A short fingerprint (sha256 of the raw key, 16 hex digits) naming the signing key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_key(private_path: Path) -> Path:
    """Write a new Ed25519 key pair: KEY (PKCS#8 PEM, mode 0600, never overwritten) and KEY.pub.

    Returns the public key's path. Refuses to replace an existing key: losing the old private
    key would make every checkpoint it signed unverifiable with a new one.
    """
    pub_path = public_key_path(private_path)
    for p in (private_path, pub_path):
        if p.exists():
            raise CheckpointError(f"{p}: already exists; refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        pub = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        pub_path.write_bytes(pub)
    except OSError as exc:
        raise CheckpointError(f"{exc.filename or private_path}: cannot write: {exc.strerror}") from exc
    return pub_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Read a private key written by :func:`generate_key`; refuses one others can read."""
    data = _read_key_file(path)
    if os.name == "posix" and path.stat().st_mode & 0o077:
        raise CheckpointError(f"{path}: private key is readable by others; run `chmod 600 {path}`")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise CheckpointError(f"{path}: not an Ed25519 key (made by `gpupool audit keygen`?)")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Read a public key written by :func:`generate_key`."""
    data = _read_key_file(path)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: not a PEM public key ({exc})") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise CheckpointError(f"{path}: not an Ed25519 public key (made by `gpupool audit keygen`?)")
    return key


def _read_key_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from exc


def sign(
    key: Ed25519PrivateKey, *, count: int, head_hash: str, server: str, at: datetime | None = None
) -> Checkpoint:
    """A checkpoint of (count, head hash) as the server reported it, signed with ``key``."""
    unsigned = Checkpoint(
        count=count,
        head_hash=head_hash,
        at=format_time(at or datetime.now(UTC)),
        server=server,
        key_id=key_id(key.public_key()),
        signature="",
    )
    sig = base64.b64encode(key.sign(unsigned.signed_bytes())).decode("ascii")
    return replace(unsigned, signature=sig)


def check(data: Mapping[str, Any], public: Ed25519PublicKey) -> Checkpoint:
    """Parse one checkpoint and verify its signature; CheckpointError says what is wrong."""
    cp = _parse(data)
    if cp.key_id != key_id(public):
        raise CheckpointError(
            f"signed by key {cp.key_id}, not by the given public key {key_id(public)}: "
            "wrong key, or the checkpoint was forged"
        )
    try:
        sig = base64.b64decode(cp.signature, validate=True)
        public.verify(sig, cp.signed_bytes())
    except (InvalidSignature, binascii.Error) as exc:
        raise CheckpointError("signature does not verify: the checkpoint was forged or altered") from exc
    return cp


def _parse(data: Mapping[str, Any]) -> Checkpoint:
    if not isinstance(data, Mapping):
        raise CheckpointError("expected a JSON object with count, headHash, at, server, keyId, signature")
    missing = [k for k in (*SIGNED_FIELDS, "signature") if k not in data]
    if missing:
        raise CheckpointError(f"missing field(s): {', '.join(missing)}")
    count = data["count"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise CheckpointError(f"count: must be a non-negative integer, got {count!r}")
    head = data["headHash"]
    if not isinstance(head, str) or not _HEX64.match(head):
        raise CheckpointError("headHash: must be 64 lowercase hex digits")
    text = {k: data[k] for k in ("at", "server", "keyId", "signature")}
    for k, v in text.items():
        if not isinstance(v, str):
            raise CheckpointError(f"{k}: must be a string")
    return Checkpoint(count, head, text["at"], text["server"], text["keyId"], text["signature"])


def read_checkpoints(text: str) -> list[dict[str, Any]]:
    """Checkpoints from a file: one JSON object (as ``--out`` writes), or one per line (``--append``)."""
    stripped = text.strip()
    if not stripped:
        raise CheckpointError("no checkpoint in the file")
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        return [whole]
    out: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"line {n}: not JSON ({exc.msg})") from exc
        if not isinstance(item, dict):
            raise CheckpointError(f"line {n}: expected a JSON object")
        out.append(item)
    return out
