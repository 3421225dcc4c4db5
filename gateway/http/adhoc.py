"""``POST /execute_sql``: ad-hoc SQL for keys whose ``connections`` grant covers the target,
through the same call pipeline as a saved query (``gateway.pipeline.adhoc``): read by
PostgreSQL's own parser, analysed and governed exactly like a saved query, each value a
checked literal. Reserved arguments (``format``, ``page``, ``page_size``, ``timeout``,
``stream``) come from the body or the query string."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..pipeline import AdHocCall, AdHocStatements
from .common import arrived, client_ip, read_json, request_id

if TYPE_CHECKING:
    import falcon

    from ..governance.schema_cache import SchemaCache
    from ..pipeline import Pipeline
    from ..settings import Settings


class AdHoc:
    __slots__ = ("_pipeline", "_settings", "_statements", "_hops")

    def __init__(self, pipeline: Pipeline, settings: Settings, schemas: SchemaCache) -> None:
        self._pipeline = pipeline
        self._settings = settings
        self._statements = AdHocStatements(settings, schemas)
        self._hops = settings.trust_proxy

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        env = req.env
        arrival = arrived(env)
        call = AdHocCall(lambda: read_json(req, self._settings.max_body_bytes), req.params, self._statements,
                         self._settings)
        self._pipeline.run(resp, call, request_id=request_id(req), ip=client_ip(env, self._hops),
                           secret=env.get("HTTP_X_API_KEY"), arrived=arrival)
