"""Single sign-on: OIDC ID tokens (JWTs) from a configured issuer, beside gpupool's own tokens.

Why: a platform team already has an identity provider with groups ("ml-platform", "vision");
mapping those groups to gpupool's roles and queue scopes means nobody hands out or revokes API
tokens by hand, and a person leaving the company loses access where it is managed already.

The configuration is a YAML file (``GPUPOOL_OIDC_CONFIG`` names it)::

    issuer: https://idp.example.com/realms/ml      # the iss claim, exactly
    audience: gpupool                              # the aud claim (the client id)
    jwksUrl: https://idp.example.com/realms/ml/protocol/openid-connect/certs
    # or jwksFile: /etc/gpupool/jwks.json          # for an air-gapped cluster
    usernameClaim: preferred_username              # default; the workload owner's name
    groupsClaim: groups                            # default
    groups:                                        # the first rule whose group matches wins
      - {group: ml-platform, role: platform-admin}
      - {group: vision-leads, role: queue-admin, scope: vision-team}
      - {group: vision, role: member, scope: vision-team}

A signature is checked with the issuer's published keys (by ``kid``); ``exp``, ``iss`` and
``aud`` must hold. A token whose groups match no rule is refused (401), naming its groups.

Besides the file's rules, the grants ``gpupool onboard`` recorded for a team's OIDC groups
(gpupool.store.onboarding, ``admins: {oidcGroups: [...]}`` in a TeamTemplate) are rules too,
read from the store (:meth:`OidcVerifier.use_grants`) and consulted after the file's, so the
platform team's own mapping always wins. They are re-read at most every ``GRANTS_CACHE_S``: a
team onboarded now can sign in within seconds, and a sign-in costs no query.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import yaml

from gpupool.auth import SCOPED_ROLES, TOKEN_PREFIX, Principal, Role

#: the environment variable naming the OIDC configuration file
CONFIG_ENV = "GPUPOOL_OIDC_CONFIG"
#: signatures accepted: asymmetric only (a shared secret would let any holder mint tokens)
ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "PS256")
#: how long the stored group grants are reused before they are read again
GRANTS_CACHE_S = 5.0
#: where stored grants come from: (group, role, scope) triples, oldest first
GrantSource = Callable[[], Sequence[tuple[str, str, str]]]


class OidcError(Exception):
    """A token that is refused, with the reason a person can act on."""


class OidcConfigError(ValueError):
    """A configuration that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class GroupRule:
    """Members of ``group`` act as ``role`` over the queue subtree ``scope``."""

    group: str
    role: Role
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class OidcConfig:
    issuer: str
    audience: str
    rules: tuple[GroupRule, ...]
    jwks_url: str | None = None
    jwks_file: Path | None = None
    username_claim: str = "preferred_username"
    groups_claim: str = "groups"
    leeway_s: float = 30.0


def _text(data: Mapping[str, Any], key: str, where: str, required: bool = True) -> str | None:
    v = data.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not v:
        raise OidcConfigError(f"{where}{key}: must be a non-empty string")
    return v


def _rule(raw: Any, i: int) -> GroupRule:
    where = f"groups[{i}]."
    if not isinstance(raw, Mapping):
        raise OidcConfigError(f"groups[{i}]: must be a mapping with group, role and (for scoped roles) scope")
    group = _text(raw, "group", where)
    try:
        role = Role(str(raw.get("role")))
    except ValueError:
        raise OidcConfigError(f"{where}role: one of {', '.join(r.value for r in Role)}") from None
    scope = _text(raw, "scope", where, required=False)
    if role in SCOPED_ROLES and scope is None:
        raise OidcConfigError(f"{where}scope: required for role {role.value} (the queue subtree it governs)")
    assert group is not None
    return GroupRule(group, role, scope)


def parse_config(data: Any, source: str = "the OIDC configuration") -> OidcConfig:
    """An :class:`OidcConfig` from a mapping; OidcConfigError naming ``source`` and the field."""
    try:
        if not isinstance(data, Mapping):
            raise OidcConfigError("must be a mapping with issuer, audience, jwksUrl or jwksFile, groups")
        url, file = _text(data, "jwksUrl", "", False), _text(data, "jwksFile", "", False)
        if (url is None) == (file is None):
            raise OidcConfigError("jwksUrl or jwksFile: set exactly one")
        groups = data.get("groups")
        if not isinstance(groups, Sequence) or isinstance(groups, str) or not groups:
            raise OidcConfigError("groups: a list of {group, role, scope} rules")
        return OidcConfig(
            issuer=str(_text(data, "issuer", "")),
            audience=str(_text(data, "audience", "")),
            rules=tuple(_rule(g, i) for i, g in enumerate(groups)),
            jwks_url=url,
            jwks_file=Path(file) if file else None,
            username_claim=str(_text(data, "usernameClaim", "", False) or "preferred_username"),
            groups_claim=str(_text(data, "groupsClaim", "", False) or "groups"),
        )
    except OidcConfigError as exc:
        raise OidcConfigError(f"{source}: {exc}") from None


def looks_like_jwt(token: str) -> bool:
    """A JWT (three dot-separated parts) rather than a gpupool token (``gpt_...``)."""
    return not token.startswith(TOKEN_PREFIX) and token.count(".") == 2


@dataclass
class OidcVerifier:
    """Checks ID tokens against the issuer's keys and maps their groups to a :class:`Principal`."""

    config: OidcConfig
    _keys: Any = field(init=False, default=None)
    _grants: GrantSource | None = field(init=False, default=None)
    _cached: tuple[float, tuple[GroupRule, ...]] | None = field(init=False, default=None)
    _mu: threading.Lock = field(init=False, default_factory=threading.Lock)

    def use_grants(self, source: GrantSource) -> None:
        """Consult the grants ``source`` returns (the store's) after the configured rules."""
        with self._mu:
            self._grants, self._cached = source, None

    def forget_grants(self) -> None:
        """Read the stored grants again at the next sign-in (onboarding just recorded some)."""
        with self._mu:
            self._cached = None

    def stored_rules(self) -> tuple[GroupRule, ...]:
        """The stored grants as rules (cached ``GRANTS_CACHE_S``); ones naming an unknown role
        are skipped, as the store accepts only scoped roles."""
        with self._mu:
            source, cached = self._grants, self._cached
        now = time.monotonic()
        if source is None:
            return ()
        if cached is not None and now - cached[0] < GRANTS_CACHE_S:
            return cached[1]
        roles = {r.value: r for r in Role}
        rules = tuple(GroupRule(g, roles[r], sc) for g, r, sc in source() if r in roles)
        with self._mu:
            self._cached = (now, rules)
        return rules

    def __post_init__(self) -> None:
        c = self.config
        if c.jwks_file is not None:
            try:
                self._keys = jwt.PyJWKSet.from_dict(json.loads(c.jwks_file.read_text(encoding="utf-8")))
            except (OSError, ValueError, jwt.PyJWTError) as exc:
                raise OidcConfigError(f"jwksFile {c.jwks_file}: cannot read a JWKS: {exc}") from None
        else:
            self._keys = jwt.PyJWKClient(str(c.jwks_url), cache_keys=True, lifespan=300, timeout=10)

    def _key(self, token: str) -> Any:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise OidcError(f"not a readable JWT: {exc}") from None
        try:
            if isinstance(self._keys, jwt.PyJWKClient):
                return self._keys.get_signing_key_from_jwt(token).key
            keys = [k for k in self._keys.keys if kid is None or k.key_id == kid]
        except jwt.PyJWTError as exc:
            raise OidcError(f"no key of the issuer signs it: {exc}") from None
        if not keys:
            raise OidcError(f"no key of the issuer has kid {kid!r}")
        return keys[0].key

    def principal(self, token: str) -> Principal:
        """The caller an ID token names; OidcError with the reason when it is refused."""
        c = self.config
        try:
            claims = jwt.decode(
                token,
                self._key(token),
                algorithms=list(ALGORITHMS),
                audience=c.audience,
                issuer=c.issuer,
                leeway=c.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise OidcError(f"the ID token is refused: {exc}") from None
        name = claims.get(c.username_claim) or claims.get("sub")
        if not isinstance(name, str) or not name:
            raise OidcError(f"the ID token has no {c.username_claim} or sub claim")
        groups = claims.get(c.groups_claim) or []
        groups = [groups] if isinstance(groups, str) else [str(g) for g in groups if isinstance(g, str)]
        for rule in (*c.rules, *self.stored_rules()):
            if rule.group in groups:
                return Principal(name, rule.role, rule.scope)
        raise OidcError(f"{name}'s groups ({', '.join(groups) or 'none'}) map to no gpupool role")


def from_env(environ: Mapping[str, str] = os.environ) -> OidcVerifier | None:
    """The verifier configured by ``GPUPOOL_OIDC_CONFIG``, or None when single sign-on is off."""
    path = environ.get(CONFIG_ENV)
    if not path:
        return None
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise OidcConfigError(f"{path}: cannot read the OIDC configuration: {exc}") from None
    return OidcVerifier(parse_config(data, path))
