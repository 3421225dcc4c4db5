"""Stage 1, identify: ``X-API-Key`` to the key's record in the worker's catalog (no I/O:
the public prefix finds the record, the secret's digest is compared in constant time)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .. import crypto
from ..errors import GatewayError, unauthorized

if TYPE_CHECKING:
    from ..model.catalog import ApiKey, Catalog


def identify(secret: str | None, catalog: Catalog) -> ApiKey:
    if not secret:
        raise unauthorized("missing API key (send it as X-API-Key)")
    prefix = crypto.secret_prefix(secret)
    record = catalog.keys.get(prefix) if prefix is not None else None
    if record is None or not crypto.matches(secret, record.digest) or not record.active:
        raise unauthorized()
    if record.expires_at is not None and record.expired(time.time()):
        raise GatewayError(401, "key_expired", "this API key has expired")
    return record
