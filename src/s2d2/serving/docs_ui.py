"""``GET /docs``: Swagger UI for ``/openapi.json``, its scripts and styles served from an installed package.

FastAPI's own ``/docs`` page loads Swagger UI from a CDN, so it is blank on a machine without internet
access. Here the page and every asset it loads come from the server itself: the files of the
``swagger-ui-bundle`` package (part of the ``serve`` extra) under ``/docs/assets/``. Without that package
installed, ``/docs`` is not served (a 404) and ``/openapi.json`` still is. FastAPI's ReDoc page (a CDN
too) is off. With ``--api-key``, ``/docs`` and ``/openapi.json`` need the key like the ``/v1`` routes
(:mod:`.security`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="icon" type="image/png" href="{assets}/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({{
  url: "{openapi}",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout"
}});
</script>
</body>
</html>
"""


def swagger_ui_files() -> Path | None:
    """The folder of Swagger UI's files from the installed ``swagger-ui-bundle`` package, or None."""
    try:
        import swagger_ui_bundle
    except ImportError:
        return None
    folder = Path(str(swagger_ui_bundle.swagger_ui_path))
    return folder if (folder / "swagger-ui-bundle.js").is_file() else None


def docs_page(title: str, openapi_url: str = "/openapi.json") -> str:
    """The ``/docs`` HTML: Swagger UI from :data:`ASSETS_PATH`, reading ``openapi_url``."""
    return _PAGE.format(title=html.escape(title), assets=ASSETS_PATH, openapi=html.escape(openapi_url))


def add_docs(app: Any) -> bool:
    """Serve ``/docs`` and its assets on ``app`` (a FastAPI app made with ``docs_url=None``); False (and
    nothing added) where the Swagger UI files are not installed."""
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles

    folder = swagger_ui_files()
    if folder is None:
        return False
    page = docs_page(f"{app.title} - API documentation", app.openapi_url or "/openapi.json")
    app.mount(ASSETS_PATH, StaticFiles(directory=folder), name="docs-assets")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(page)

    return True


__all__ = ["ASSETS_PATH", "DOCS_PATH", "add_docs", "docs_page", "swagger_ui_files"]
