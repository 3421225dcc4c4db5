"""``GET /docs``: the calling key's ``/openapi.json`` rendered in a browser by Swagger UI, every
asset served by the gateway itself (``static/swagger-ui``: swagger-ui-dist 5.33.0, vendored;
nothing outside the machine is reachable at run time).

As QueryAPIGate's ``/docs``: the page is public and holds no data; the user types a key into it,
the page keeps it for the browser tab (sessionStorage) and sends it as ``X-API-Key`` when it
fetches ``/openapi.json`` and with "Try it out" calls (``static/docs.js``). So what the page
shows is exactly what ``/openapi.json`` answers that key. Unlike QueryAPIGate's page (a CDN and
an inline script by hash), its Content-Security-Policy allows scripts, styles, images and
requests from this origin only.

The assets are read once per worker, at the first request for them, and answered from memory
with an ETag (a browser revalidates them; 304 when unchanged).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import falcon

from ..errors import not_found

SWAGGER_UI_VERSION = "5.33.0"
STATIC = Path(__file__).parent / "static"
# name in /docs/assets/<name> -> (file under static/, content type)
_ASSETS = {
    "swagger-ui-bundle.js": ("swagger-ui/swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("swagger-ui/swagger-ui.css", "text/css; charset=utf-8"),
    "docs.js": ("docs.js", "text/javascript; charset=utf-8"),
    "docs.css": ("docs.css", "text/css; charset=utf-8"),
}

# Swagger UI needs no inline script or style element (React sets styles through the DOM, which
# style-src does not govern) and draws its icons as data: images.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                     "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}

# Relative links: /docs/assets/... and /openapi.json resolve under whatever prefix serves /docs.
PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gateway-fleet API docs</title>
<link rel="stylesheet" href="docs/assets/swagger-ui.css">
<link rel="stylesheet" href="docs/assets/docs.css">
</head>
<body>
<form id="key-form" autocomplete="off">
  <label for="key">API key</label>
  (it shows the saved queries this key may run, and is sent with "Try it out" calls; kept for this browser tab only):
  <input id="key" type="password" autocomplete="off" placeholder="X-API-Key">
  <button id="save-key" type="submit">Apply</button>
</form>
<div id="ui"></div>
<!-- Swagger UI {SWAGGER_UI_VERSION} (Apache-2.0), served by this gateway -->
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script src="docs/assets/docs.js"></script>
</body></html>
""".encode()


class DocsPage:
    __slots__ = ()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.data = PAGE
        resp.content_type = "text/html; charset=utf-8"
        resp.set_headers(_SECURITY_HEADERS)
        resp.set_header("Cache-Control", "no-cache")


class DocsAsset:
    """``GET /docs/assets/<name>``: one of ``_ASSETS``, from memory; anything else 404."""

    __slots__ = ("_loaded",)

    def __init__(self) -> None:
        self._loaded: dict[str, tuple[bytes, str]] = {}   # name -> (content, etag)

    def _load(self, name: str) -> tuple[bytes, str] | None:
        found = self._loaded.get(name)
        if found is None and name in _ASSETS:
            data = (STATIC / _ASSETS[name][0]).read_bytes()
            found = self._loaded[name] = (data, '"' + hashlib.sha256(data).hexdigest()[:32] + '"')
        return found

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        found = self._load(name)
        if found is None:
            raise not_found("not_found", "No such route.")
        data, etag = found
        resp.set_headers(_SECURITY_HEADERS)
        resp.set_header("ETag", etag)
        resp.set_header("Cache-Control", "public, max-age=3600")
        if etag in (req.get_header("If-None-Match") or ""):
            resp.status = falcon.HTTP_304
            return
        resp.content_type = _ASSETS[name][1]
        resp.data = data
