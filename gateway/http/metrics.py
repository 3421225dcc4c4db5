"""``GET /metrics``: the worker's Prometheus exposition (every worker's, aggregated)."""
from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST

from ..errors import unauthorized
from ..observe import Metrics

if TYPE_CHECKING:
    import falcon


class MetricsResource:
    """``GET /metrics``: Prometheus text format, optionally behind ``GATEWAY_METRICS_TOKEN``."""

    def __init__(self, metrics: Metrics, token: str) -> None:
        self._metrics = metrics
        self._token = token.encode() if token else None

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self._token is not None:
            scheme, _, given = req.env.get("HTTP_AUTHORIZATION", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
                raise unauthorized("metrics need Authorization: Bearer <GATEWAY_METRICS_TOKEN>")
        resp.data = self._metrics.exposition()
        resp.content_type = CONTENT_TYPE_LATEST

