"""``GET /metrics``: the worker's Prometheus exposition (every worker's, aggregated), for a
caller with the metrics token only.

The series name every query that was called, with its error and quota counts: what a
stranger should not learn. So nothing is served without ``GATEWAY_METRICS_TOKEN``, sent as
Prometheus sends it (``authorization: {credentials: ...}`` or ``bearer_token`` in a scrape
config: ``Authorization: Bearer <token>``), compared in constant time. Unset, the route is
off for everyone (403 ``metrics_disabled``), rather than open or open to the loopback: behind
``fleet up``'s nginx, or a sidecar in the same network namespace, every caller is the loopback.
"""
from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST

from ..errors import GatewayError, forbidden
from ..observe import Metrics

if TYPE_CHECKING:
    import falcon


class MetricsResource:
    """``GET /metrics``: Prometheus text format behind ``GATEWAY_METRICS_TOKEN``."""

    def __init__(self, metrics: Metrics, token: str) -> None:
        self._metrics = metrics
        self._token = token.encode() if token else None

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self._token is None:
            raise forbidden("metrics_disabled", "/metrics is off: set GATEWAY_METRICS_TOKEN and scrape with "
                            "Authorization: Bearer <token>")
        scheme, _, given = req.env.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
            raise GatewayError(401, "unauthorized", "metrics need Authorization: Bearer <GATEWAY_METRICS_TOKEN>",
                               headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
        resp.data = self._metrics.exposition()
        resp.content_type = CONTENT_TYPE_LATEST
