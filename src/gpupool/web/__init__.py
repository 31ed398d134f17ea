"""The web dashboard: static pages served by the API process, talking to the same REST API.

No build step and no CDN: the page must open on an air-gapped cluster.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"


def mount(app: FastAPI) -> None:
    """Serve the dashboard at /ui/ (and redirect / there)."""
    app.mount("/ui", StaticFiles(directory=STATIC, html=True), name="ui")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/")
