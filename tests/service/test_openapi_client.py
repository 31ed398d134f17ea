"""A client generated from the served OpenAPI document works against a running server: typed
bodies parse the answers, the bearer scheme is declared, and /docs and /redoc need no internet."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.test_service_support import Server, wl

CODEGEN = shutil.which("datamodel-codegen", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("oaclient") / "state", time_scale=1.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def models(server: Server, tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    if CODEGEN is None:
        pytest.skip("datamodel-code-generator is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("generated")
    spec = out / "openapi.json"
    spec.write_bytes(httpx.get(server.base + "/openapi.json").content)
    target = out / "gpupool_models.py"
    cmd = [CODEGEN, "--input", str(spec), "--input-file-type", "openapi", "--output", str(target)]
    cmd += ["--output-model-type", "pydantic_v2.BaseModel"]
    subprocess.run(cmd, check=True, capture_output=True)
    loaded = importlib.util.spec_from_file_location("gpupool_models", target)
    assert loaded is not None and loaded.loader is not None
    mod = importlib.util.module_from_spec(loaded)
    sys.modules["gpupool_models"] = mod
    loaded.loader.exec_module(mod)
    return mod


class GeneratedClient:
    """The generated models over HTTP, authenticating as the document's security scheme says."""

    def __init__(self, base: str, token: str, schema: dict[str, Any], models: ModuleType) -> None:
        scheme = schema["components"]["securitySchemes"]["bearerAuth"]
        assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
        self.http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"})
        self.m = models

    def submit(self, body: dict[str, Any]) -> Any:
        r = self.http.post("/v1/workloads", json=body)
        assert r.status_code == 201, r.text
        return self.m.WorkloadView.model_validate(r.json())

    def list_workloads(self, **params: Any) -> Any:
        return self.m.WorkloadList.model_validate(self.http.get("/v1/workloads", params=params).json())

    def explain(self, name: str) -> Any:
        return self.m.Explanation.model_validate(self.http.get(f"/v1/workloads/{name}/explain").json())


def test_the_generated_client_reads_typed_answers(server: Server, models: ModuleType) -> None:
    schema = httpx.get(server.base + "/openapi.json").json()
    client = GeneratedClient(server.base, server.token, schema, models)
    made = client.submit(wl("gen-a", duration="1h"))
    assert made.name == "gen-a" and made.queue == "llm-research"
    client.submit(wl("gen-b", duration="1h"))
    page = client.list_workloads(limit=1)
    assert [w.name for w in page.items] == ["gen-b"]  # newest first
    token = page.metadata.continue_
    assert token
    assert [w.name for w in client.list_workloads(limit=1, **{"continue": token}).items] == ["gen-a"]
    assert client.explain("gen-a").name == "gen-a"


def test_every_authenticated_operation_declares_the_bearer_scheme(server: Server) -> None:
    schema = httpx.get(server.base + "/openapi.json").json()
    ops = [op for item in schema["paths"].values() for op in item.values() if isinstance(op, dict)]
    authed = [op for op in ops if "401" in op["responses"]]
    assert len(authed) > 20
    assert all(op.get("security") == [{"bearerAuth": []}] for op in authed)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_take_every_asset_from_this_server(server: Server, page: str) -> None:
    html = httpx.get(server.base + page).text
    sources = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    sources += re.findall(r"""url: ?["']([^"']+)["']""", html)
    assert sources, html
    assert not [s for s in sources if s.startswith(("http:", "https:", "//"))], sources
    for s in sources:
        r = httpx.get(server.base + s)
        assert r.status_code == 200 and len(r.content) > 100, s
