"""Single sign-on: ID tokens signed by the issuer's key (a pair made here) become principals with
the role and queue scope their groups map to; anything else is a 401 saying why."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa

from gpupool.auth import Role
from gpupool.oidc import OidcConfigError, OidcError, OidcVerifier, looks_like_jwt, parse_config
from tests.test_service_support import running_app, wl

ISSUER = "https://idp.example.test/realms/ml"
RULES = [
    {"group": "ml-platform", "role": "platform-admin"},
    {"group": "vision", "role": "member", "scope": "vision-team"},
]


def key_pair(kid: str) -> tuple[Any, dict[str, Any]]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    return private, {**public, "kid": kid, "use": "sig", "alg": "RS256"}


KEY, JWK = key_pair("k1")
OTHER, _ = key_pair("k1")  # same kid, another key: a forgery


def id_token(key: Any = KEY, kid: str = "k1", alg: str = "RS256", **claims: Any) -> str:
    body = {
        "iss": ISSUER,
        "aud": "gpupool",
        "exp": int(time.time()) + 600,
        "preferred_username": "vera",
        "groups": ["vision"],
        **claims,
    }
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [JWK]}))
    cfg = {"issuer": ISSUER, "audience": "gpupool", "jwksFile": str(jwks), "groups": RULES}
    f = tmp_path / "oidc.yaml"
    f.write_text(yaml.safe_dump(cfg))
    return f


def verifier(config_file: Path) -> OidcVerifier:
    return OidcVerifier(parse_config(yaml.safe_load(config_file.read_text())))


def test_groups_map_to_role_and_scope(config_file: Path) -> None:
    v = verifier(config_file)
    p = v.principal(id_token())
    assert (p.name, p.role, p.scope) == ("vera", Role.MEMBER, "vision-team")
    admin = v.principal(id_token(groups=["staff", "ml-platform"], preferred_username="ada"))
    assert (admin.name, admin.role, admin.scope) == ("ada", Role.PLATFORM_ADMIN, None)


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (lambda: id_token(exp=int(time.time()) - 3600), "expired"),
        (lambda: id_token(aud="someone-else"), "audience"),
        (lambda: id_token(iss="https://evil.example.test"), "issuer"),
        (lambda: id_token(key=OTHER), "signature"),
        (lambda: id_token(kid="k9"), "kid 'k9'"),
        (lambda: id_token(groups=["finance"]), "(finance) map to no gpupool role"),
        (lambda: id_token(key="a shared secret of 32 bytes or so!", alg="HS256"), "refused"),
    ],
)
def test_refusals_say_why(config_file: Path, token: Any, why: str) -> None:
    with pytest.raises(OidcError, match="(?i)" + re.escape(why)):
        verifier(config_file).principal(token())


def test_bad_configuration_names_the_field() -> None:
    base = {"issuer": ISSUER, "audience": "gpupool", "jwksUrl": "http://127.0.0.1:1/jwks", "groups": RULES}
    with pytest.raises(OidcConfigError, match=r"groups\[0\]\.scope: required for role member"):
        parse_config({**base, "groups": [{"group": "g", "role": "member"}]})
    with pytest.raises(OidcConfigError, match="set exactly one"):
        parse_config({**base, "jwksFile": "/x"})
    with pytest.raises(OidcConfigError, match=r"groups\[0\]\.role: one of platform-admin"):
        parse_config({**base, "groups": [{"group": "g", "role": "boss"}]})
    assert looks_like_jwt(id_token()) and not looks_like_jwt("gpt_abc.def.ghi")


def test_jwks_from_the_issuer_url() -> None:
    body = json.dumps({"keys": [JWK]}).encode()

    class Jwks(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/certs"
        cfg = {"issuer": ISSUER, "audience": "gpupool", "jwksUrl": url, "groups": RULES}
        assert OidcVerifier(parse_config(cfg)).principal(id_token()).scope == "vision-team"
    finally:
        srv.shutdown()


@pytest.fixture
def app_with_sso(tmp_path: Path, config_file: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("GPUPOOL_OIDC_CONFIG", str(config_file))
    with running_app(tmp_path / "state") as api:
        yield api


def test_the_api_accepts_id_tokens_beside_its_own(app_with_sso: Any) -> None:
    api = app_with_sso
    vera = id_token()
    r = api.req("POST", "/v1/workloads", token=vera, json=wl("sso-ok", queue="vision-team"))
    assert r.status_code == 201, r.text
    assert r.json()["owner"] == "vera"
    r = api.req("POST", "/v1/workloads", token=vera, json=wl("sso-no", queue="llm-research"))
    assert r.status_code == 403
    r = api.req("GET", "/v1/workloads", token=id_token(exp=int(time.time()) - 3600))
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    assert api.req("GET", "/v1/workloads").status_code == 200  # the bootstrap gpt_ token still works
