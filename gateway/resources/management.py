"""``/api/v1``: thin HTTP shells over ``gateway.manage.Management``."""
from __future__ import annotations

import orjson

from ..manage import ACTOR, Actor
from .common import client_ip, read_json, request_id


def _send(resp, doc, status: int = 200, no_store: bool = False) -> None:
    resp.status = status
    resp.data = orjson.dumps(doc)
    resp.content_type = "application/json"
    if no_store:
        resp.set_header("Cache-Control", "no-store")


class _Admin:
    def __init__(self, manage, admin_check, settings):
        self.m = manage
        self._check = admin_check
        self._max = settings.max_body_bytes
        self._hops = settings.trust_proxy

    def body(self, req) -> dict:
        return read_json(req, self._max)

    def process(self, req) -> None:
        self._check(req)
        ACTOR.set(Actor("admin", client_ip(req.env, self._hops), request_id(req)))


def _guarded(cls):
    """Every responder of a management resource checks the admin key first."""
    for attr in [a for a in dir(cls) if a.startswith("on_")]:
        responder = getattr(cls, attr)

        def wrapped(self, req, resp, *args, _responder=responder, **kwargs):
            self.process(req)
            return _responder(self, req, resp, *args, **kwargs)
        setattr(cls, attr, wrapped)
    return cls


@_guarded
class Connections(_Admin):
    def on_get(self, req, resp):
        _send(resp, self.m.list_connections())

    def on_post(self, req, resp):
        _send(resp, self.m.create_connection(self.body(req)), 201)


@_guarded
class Connection(_Admin):
    def on_get(self, req, resp, name):
        _send(resp, self.m.get_connection(name))

    def on_patch(self, req, resp, name):
        _send(resp, self.m.update_connection(name, self.body(req)))

    on_put = on_patch

    def on_delete(self, req, resp, name):
        self.m.delete_connection(name)
        resp.status = 204


@_guarded
class Queries(_Admin):
    def on_get(self, req, resp):
        _send(resp, self.m.list_queries())

    def on_post(self, req, resp):
        _send(resp, self.m.create_query(self.body(req)), 201)


@_guarded
class Query(_Admin):
    def on_get(self, req, resp, name):
        _send(resp, self.m.get_query(name))

    def on_delete(self, req, resp, name):
        self.m.delete_query(name)
        resp.status = 204


@_guarded
class QueryVersions(_Admin):
    def on_post(self, req, resp, name):
        _send(resp, self.m.add_version(name, self.body(req)), 201)


@_guarded
class QueryPublish(_Admin):
    def on_post(self, req, resp, name):
        _send(resp, self.m.publish(name, self.body(req)))


@_guarded
class QueryUnpublish(_Admin):
    def on_post(self, req, resp, name):
        _send(resp, self.m.unpublish(name))


@_guarded
class Keys(_Admin):
    def on_get(self, req, resp):
        _send(resp, self.m.list_keys())

    def on_post(self, req, resp):
        _send(resp, self.m.create_key(self.body(req)), 201, no_store=True)


@_guarded
class Key(_Admin):
    def on_get(self, req, resp, name):
        _send(resp, self.m.get_key(name))

    def on_patch(self, req, resp, name):
        _send(resp, self.m.update_key(name, self.body(req)))

    def on_delete(self, req, resp, name):
        self.m.delete_key(name)
        resp.status = 204


@_guarded
class KeyRotate(_Admin):
    def on_post(self, req, resp, name):
        _send(resp, self.m.rotate_key(name), no_store=True)


@_guarded
class Audit(_Admin):
    def on_get(self, req, resp):
        _send(resp, self.m.audit(req.params))


@_guarded
class History(_Admin):
    def on_get(self, req, resp):
        _send(resp, self.m.history(req.params))


class QuotaUsage:
    """``GET /api/v1/usage/quotas``: each key's quota and what the fleet used this period."""

    def __init__(self, admission, holder, admin_check):
        self._admission = admission
        self._holder = holder
        self._check = admin_check

    def on_get(self, req, resp):
        self._check(req)
        keys = sorted(self._holder.current().keys.values(), key=lambda k: k.name)
        _send(resp, {"items": self._admission.usage(keys)})


ROUTES = [
    ("/api/v1/connections", Connections),
    ("/api/v1/connections/{name}", Connection),
    ("/api/v1/queries", Queries),
    ("/api/v1/queries/{name}", Query),
    ("/api/v1/queries/{name}/versions", QueryVersions),
    ("/api/v1/queries/{name}/publish", QueryPublish),
    ("/api/v1/queries/{name}/unpublish", QueryUnpublish),
    ("/api/v1/api-keys", Keys),
    ("/api/v1/api-keys/{name}", Key),
    ("/api/v1/api-keys/{name}/rotate", KeyRotate),
    ("/api/v1/audit", Audit),
    ("/api/v1/history", History),
]
