"""``/api/v1``: thin HTTP shells over the control services (``gateway.control``)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import falcon
import orjson

from ..control import ACTOR, Actor, Management
from ..errors import not_found
from .common import client_ip, read_json, request_id

if TYPE_CHECKING:
    from ..model.state import CatalogHolder
    from ..ports import Admission
    from ..settings import Settings

_Resource = TypeVar("_Resource", bound="type[_Admin]")


def _send(resp: falcon.Response, doc: object, status: int = 200, no_store: bool = False) -> None:
    resp.status = status
    resp.data = orjson.dumps(doc)
    resp.content_type = "application/json"
    if no_store:
        resp.set_header("Cache-Control", "no-store")


class _Admin:
    def __init__(self, manage: Management, admin_check: Callable[[falcon.Request], None], settings: Settings) -> None:
        self.m = manage
        self._check = admin_check
        self._max = settings.max_body_bytes
        self._hops = settings.trust_proxy

    def body(self, req: falcon.Request) -> dict:
        return read_json(req, self._max)

    def process(self, req: falcon.Request) -> None:
        self._check(req)
        ACTOR.set(Actor("admin", client_ip(req.env, self._hops), request_id(req)))


def _admin_first(req: falcon.Request, resp: falcon.Response, resource: object, params: dict[str, Any]) -> None:
    cast(_Admin, resource).process(req)   # applied to management resources only (_guarded)


def _guarded(cls: _Resource) -> _Resource:
    """Every responder of a management resource checks the admin key first (Falcon's
    ``before`` hook, applied to each responder of the class)."""
    return falcon.before(_admin_first)(cls)


@_guarded
class ConnectionsResource(_Admin):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, self.m.connections.list())

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, self.m.connections.create(self.body(req)), 201)


@_guarded
class ConnectionResource(_Admin):
    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.connections.get(name))

    def on_patch(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.connections.update(name, self.body(req)))

    on_put = on_patch

    def on_delete(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        self.m.connections.delete(name)
        resp.status = 204


@_guarded
class QueriesResource(_Admin):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, self.m.queries.list(req.params))

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, self.m.queries.create(self.body(req)), 201)


@_guarded
class QueryDefinitionResource(_Admin):
    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.queries.get(name))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        self.m.queries.delete(name)
        resp.status = 204


@_guarded
class QueryVersionsResource(_Admin):
    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.queries.add_version(name, self.body(req)), 201)


@_guarded
class QueryVersionResource(_Admin):
    def on_patch(self, req: falcon.Request, resp: falcon.Response, name: str, version: str) -> None:
        # ASCII digits only: str.isdigit() also takes "²" (which int() refuses) and "١" (which it reads as 1).
        if not (version.isascii() and version.isdigit()) or len(version) > 9:
            raise not_found("version_not_found", f"query '{name}' has no version {version}")
        _send(resp, self.m.queries.set_cache_ttl(name, int(version), self.body(req)))


@_guarded
class QueryPublishResource(_Admin):
    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.queries.publish(name, self.body(req)))


@_guarded
class QueryUnpublishResource(_Admin):
    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.queries.unpublish(name))


@_guarded
class KeysResource(_Admin):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, self.m.keys.list())

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, self.m.keys.create(self.body(req)), 201, no_store=True)


@_guarded
class KeyResource(_Admin):
    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.keys.get(name))

    def on_patch(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.keys.update(name, self.body(req)))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        self.m.keys.delete(name)
        resp.status = 204


@_guarded
class KeyRotateResource(_Admin):
    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.keys.rotate(name, self.body(req)), no_store=True)


@_guarded
class KeyPreviousResource(_Admin):
    def on_delete(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        _send(resp, self.m.keys.end_previous(name))


@_guarded
class AuditResource(_Admin):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, self.m.audit.audit(req.params))


@_guarded
class HistoryResource(_Admin):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, self.m.audit.history(req.params))


class QuotaUsageResource:
    """``GET /api/v1/usage/quotas``: each key's quota and what the fleet used this period."""

    def __init__(self, admission: Admission, holder: CatalogHolder,
                 admin_check: Callable[[falcon.Request], None]) -> None:
        self._admission = admission
        self._holder = holder
        self._check = admin_check

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._check(req)
        # A key rotated within its grace period is indexed by both prefixes: list it once.
        keys = sorted({k.id: k for k in self._holder.current().keys.values()}.values(), key=lambda k: k.name)
        items = self._admission.usage(keys)
        for item in items:   # QueryAPIGate's names beside this gateway's
            item.update(caller=item["key"], per=item["quota"]["per"], calls=item["calls_used"],
                        rows=item["rows_used"], updated_at=None)
        _send(resp, {"items": items})


ROUTES = [
    ("/api/v1/connections", ConnectionsResource),
    ("/api/v1/connections/{name}", ConnectionResource),
    ("/api/v1/queries", QueriesResource),
    ("/api/v1/queries/{name}", QueryDefinitionResource),
    ("/api/v1/queries/{name}/versions", QueryVersionsResource),
    ("/api/v1/queries/{name}/versions/{version}", QueryVersionResource),
    ("/api/v1/queries/{name}/publish", QueryPublishResource),
    ("/api/v1/queries/{name}/unpublish", QueryUnpublishResource),
    ("/api/v1/api-keys", KeysResource),
    ("/api/v1/api-keys/{name}", KeyResource),
    ("/api/v1/api-keys/{name}/rotate", KeyRotateResource),
    ("/api/v1/api-keys/{name}/previous", KeyPreviousResource),
    ("/api/v1/audit", AuditResource),
    ("/api/v1/history", HistoryResource),
]
