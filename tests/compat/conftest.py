"""The differential suite's servers: QueryAPIGate 0.43.0 (``loadtests.peer``: its own virtual
environment in ``.bench/qag-venv``, installed from PyPI when missing, started as its Docker image
runs it) on a store database of its own in the session's PostgreSQL, and this gateway's session
gunicorn master (``gunicorn`` fixture, 2 workers); both read the same demo database. Every call of
``compat_calls.calls()`` is sent to both, in order, once per session (``replies``).

``GATEWAY_TEST_PEER_PORT`` fixes the peer's port (default: a free one).
"""
from __future__ import annotations

import os
import uuid

import pytest
import requests
from compat_calls import calls

from helpers.api import NO_BODY, Api
from helpers.ports import free_port
from helpers.util import ADMIN_KEY, PASSWORD_ENV
from loadtests import peer

PEER_ADMIN_KEY = "qag-admin-" + uuid.uuid4().hex
PEER_STORE = "qag_compat"


@pytest.fixture(scope="session")
def peer_server(services, tmp_path_factory):
    if not peer.GUNICORN.exists():
        peer.setup()   # CI: queryapigate[postgres,flow,server]==0.43.0 from PyPI, cached in .bench/qag-venv
    services.sql(f"DROP DATABASE IF EXISTS {PEER_STORE} WITH (FORCE)", db="postgres")
    services.pg.ensure_database(PEER_STORE)
    port = int(os.environ.get("GATEWAY_TEST_PEER_PORT") or free_port())
    target = peer.start(port=port, cpu=None, store_url=services.pg.url(PEER_STORE),
                        run_dir=tmp_path_factory.mktemp("peer"), admin_key=PEER_ADMIN_KEY,
                        # Read its store on every request (its default): a change is seen by the next call,
                        # as this gateway's are. Connections name their password ${PASSWORD_ENV} on both.
                        extra_env={"QUERYAPIGATE_METADATA_CACHE_TTL": "0", PASSWORD_ENV: services.pg.password()})
    try:
        yield target
    finally:
        peer.stop_process(target.process)


@pytest.fixture(scope="session")
def peer_openapi(peer_server) -> dict:
    """QueryAPIGate's own OpenAPI document (as the admin key sees it)."""
    reply = requests.get(peer_server.base_url + "/openapi.json", headers={"X-API-Key": PEER_ADMIN_KEY}, timeout=30)
    assert reply.status_code == 200, reply.text[:300]
    return reply.json()


class Side:
    """One server as the suite drives it: its transport, its admin key and the secrets of the keys
    the calls made there."""

    def __init__(self, name: str, api: Api, admin_key: str):
        self.name = name
        self.api = api
        self.secrets = {"admin": admin_key, "bad": "sk_" + "0" * 43}

    def send(self, call, suffix: str):
        path = call.path.replace("~", suffix)
        body = _fill(call.body, suffix)
        headers = {}
        if call.key is not None:
            # A key whose creation failed here gets an unknown secret (its calls then answer 401).
            headers["X-API-Key"] = self.secrets.get(call.key.replace("~", suffix), self.secrets["bad"])
        reply = self.api.request(call.method, path, params=_fill(call.qs, suffix),
                                 json_body=NO_BODY if body is None else body, headers=headers)
        self._remember(path, body, reply)
        return reply

    def _remember(self, path: str, body, reply) -> None:
        if not path.startswith("/api/v1/api-keys") or reply.status not in (200, 201):
            return
        doc = reply.json
        if "secret" not in doc:
            return
        name = doc["name"]
        if path.endswith("/rotate") and name in self.secrets:
            self.secrets[name + "@old"] = self.secrets[name]
        self.secrets[name] = doc["secret"]


def _fill(value, suffix: str):
    if isinstance(value, str):
        return value.replace("~", suffix)
    if isinstance(value, dict):
        return {_fill(k, suffix): _fill(v, suffix) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, suffix) for v in value]
    return value


@pytest.fixture(scope="session")
def replies(peer_server, gunicorn, services) -> dict:
    """Every call sent to QueryAPIGate, then to this gateway: ``{call.id: (peer reply, our reply)}``."""
    suffix = "_" + uuid.uuid4().hex[:8]
    theirs = Side("peer", Api.over_http(peer_server.base_url, services), PEER_ADMIN_KEY)
    ours = Side("ours", Api.over_http(gunicorn.base, services), ADMIN_KEY)
    got = {}
    try:
        for call in calls(services.pg.port, services.data_database):
            got[call.id] = (theirs.send(call, suffix), ours.send(call, suffix))
    finally:
        theirs.api.close()
        ours.api.close()
    return got
