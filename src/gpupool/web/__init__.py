"""The web dashboard: static pages served by the API process, talking to the same REST API.

No build step and no CDN: the page must open on an air-gapped cluster.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
#: where /docs and /redoc take their scripts: a wheel's files, so they open without internet
DOCS_ASSETS = "/docs-assets"


def docs_assets() -> Path:
    """The directory of the Swagger UI and ReDoc files that the fastapi-offline wheel ships."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


#: the dashboard's charting library, from the plotly wheel (a dependency), never a CDN
PLOTLY_URL = "/ui-assets/plotly/plotly.min.js"


def plotly_dir() -> Path:
    """Where the plotly wheel keeps ``plotly.min.js``."""
    import plotly

    return Path(plotly.__file__).parent / "package_data"


def mount_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with every asset served by this process.

    Why: FastAPI's own pages load their scripts from a CDN, so on an air-gapped cluster (or
    any machine without internet) they were blank."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=docs_assets()), name="docs-assets")
    spec = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=spec,
            title=f"{app.title} API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=spec,
            title=f"{app.title} API",
            redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )


def mount(app: FastAPI) -> None:
    """Serve the dashboard at /ui/ (and redirect / there), and the API docs pages."""
    app.mount(PLOTLY_URL.rsplit("/", 1)[0], StaticFiles(directory=plotly_dir()), name="ui-plotly")
    app.mount("/ui", StaticFiles(directory=STATIC, html=True), name="ui")
    mount_docs(app)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/")
