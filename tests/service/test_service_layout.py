"""The service's layers, read from the source: routes ask the read model and the store, never
the engine or SQL; create_app keeps the submit route first in one flat route list."""

from __future__ import annotations

import ast
from pathlib import Path

from fastapi.routing import APIRoute

from gpupool.service.api import create_app

ROUTES = Path(__file__).resolve().parents[2] / "src" / "gpupool" / "service" / "routes"


def _modules() -> list[tuple[str, ast.Module]]:
    return [(p.name, ast.parse(p.read_text())) for p in sorted(ROUTES.glob("*.py"))]


def test_routes_do_not_read_the_engine() -> None:
    for name, tree in _modules():
        for node in ast.walk(tree):
            assert not (isinstance(node, ast.Attribute) and node.attr == "engine"), f"{name}:{node.lineno}"


def test_routes_run_no_sql() -> None:
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(m.startswith("sqlalchemy") for m in mods), f"{name}:{node.lineno}"


def test_submit_is_matched_first_in_a_flat_route_list() -> None:
    app = create_app(start_controller=False)
    first = app.router.routes[0]
    assert isinstance(first, APIRoute) and first.path == "/v1/workloads" and first.methods == {"POST"}
    api = [r for r in app.router.routes if isinstance(r, APIRoute)]
    assert len({(r.path, m) for r in api for m in r.methods or ()}) == len(api) >= 30
