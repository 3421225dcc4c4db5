"""``GET /docs`` (gateway/http/docs.py): Swagger UI over the calling key's ``/openapi.json``,
every asset served by the gateway. Loaded in headless Chromium through a real gunicorn master:
the key typed into the page brings its own saved queries and no other key's; the page asks
nothing of any other origin and its CSP refuses nothing it needs."""
from __future__ import annotations

import base64
import hashlib
import json

import pytest

from gateway.http.docs import CSP, STATIC
from helpers.browser import CHROMIUM, Browser

# The vendored files are swagger-ui-dist 5.33.0 byte for byte (static/swagger-ui/VERSION.md).
PINNED = {"swagger-ui-bundle.js": "sha384-YDALVcy8kj8yltLBVi1vBiBAUqdxvus673gM8XKwiy6aDUJFXivF/KCufekjYbVf",
          "swagger-ui.css": "sha384-Ov4/wv3j2bmct8cDc5X4ngJZohVPzEmc6uDPH8WeljUxO5vtoykvMEfbu9Vh6RaW"}
# Swagger UI writes a zero-width space before each '/' of a path (line breaks): read without them.
UI_TEXT = "(document.querySelector('#ui') ? document.querySelector('#ui').innerText : '').replace(/\\u200b/g, '')"


def test_the_vendored_files_are_the_pinned_release():
    for name, digest in PINNED.items():
        data = (STATIC / "swagger-ui" / name).read_bytes()
        assert "sha384-" + base64.b64encode(hashlib.sha384(data).digest()).decode() == digest, name
    assert "Apache License" in (STATIC / "swagger-ui" / "LICENSE").read_text()


def test_page_and_assets_headers(client):
    page = client.simulate_get("/docs")
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert page.headers["Content-Security-Policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "http" not in CSP          # self only
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert "<script>" not in page.text and "<style>" not in page.text  # nothing inline for the CSP to allow
    for name, kind in (("swagger-ui-bundle.js", "text/javascript"), ("swagger-ui.css", "text/css"),
                       ("docs.js", "text/javascript"), ("docs.css", "text/css")):
        got = client.simulate_get(f"/docs/assets/{name}")
        assert got.status_code == 200 and got.headers["Content-Type"].startswith(kind), name
        again = client.simulate_get(f"/docs/assets/{name}", headers={"If-None-Match": got.headers["ETag"]})
        assert again.status_code == 304 and not again.content, name
    for bad in ("LICENSE", "..%2Fdocs.py", "swagger-ui-bundle.js.map", "%2e%2e"):
        got = client.simulate_get(f"/docs/assets/{bad}")
        assert got.status_code == 404 and got.json["code"] == "not_found", bad


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/bootstrap installs it)")
def test_the_page_renders_the_keys_queries_in_chromium(http, gunicorn, demo_connection, tmp_path):
    mine = [http.query("SELECT :aid::int AS aid", {"aid": "int"}, connection=demo_connection,
                       description="Mine, by id"),
            http.query("SELECT 2 AS two", connection=demo_connection)]
    theirs = http.query("SELECT 3 AS three", connection=demo_connection, description="Not yours")
    my_key = http.key(mine, [])
    their_key = http.key([theirs], [])
    base = gunicorn.base
    with Browser(tmp_path / "profile", timeout=60) as browser:
        browser.open(base + "/docs")
        # Without a key: the page and the routes render, no saved query.
        text = browser.wait_for(f"({UI_TEXT}).includes('/execute_sql') && ({UI_TEXT})")
        assert not any(name in text for name in [*mine, theirs]), text
        # The key typed in, as a user does: kept for the tab, the document fetched with it.
        browser.evaluate(f"document.getElementById('key').value = {json.dumps(my_key)}; "
                         "document.getElementById('save-key').click(); true")
        text = browser.wait_for(f"({UI_TEXT}).includes('/q/{mine[0]}') && ({UI_TEXT})", timeout=60)
        assert f"/q/{mine[1]}" in text and "Mine, by id" in text
        assert theirs not in text and "Not yours" not in text
        assert browser.evaluate("document.getElementById('key').value") == my_key   # kept across the reload
        # The other key, in the same tab: its query and none of mine.
        browser.evaluate(f"document.getElementById('key').value = {json.dumps(their_key)}; "
                         "document.getElementById('save-key').click(); true")
        text = browser.wait_for(f"({UI_TEXT}).includes('/q/{theirs}') && ({UI_TEXT})", timeout=60)
        assert not any(name in text for name in mine), text
        assert browser.evaluate("window.__csp") == []                     # the CSP refused nothing
        requested = browser.requested()
        elsewhere = [url for url in requested if not url.startswith((base + "/", "data:"))]
        assert requested and not elsewhere, elsewhere
        assert {base + "/docs/assets/swagger-ui-bundle.js", base + "/openapi.json"} <= set(requested)
        assert not any("key" in url.split("?", 1)[-1] for url in requested if "?" in url)   # never in a URL
