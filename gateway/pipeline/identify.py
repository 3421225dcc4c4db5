"""Stage identify: ``X-API-Key`` to the key's record in the worker's catalog (no I/O:
the public prefix finds the record, the secret's digest is compared in constant time).

Two rarer cases cost nothing on the common path: a secret whose prefix is a key's previous
one (rotated, still in its grace period) is compared with the previous digest; a secret with
no key's prefix may be the admin key, which QueryAPIGate's users also send to the data plane.

The key's ``allowed_ips`` is part of identifying it: every use of a key (a call, the
description of what it may run) names the client address, so no entry point can forget it."""
from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING

from .. import crypto
from ..errors import GatewayError, unauthorized
from ..model.catalog import ApiKey

if TYPE_CHECKING:
    from ..model.catalog import Catalog
    from ..settings import Settings


class AdminIdentity:
    """The admin key, as a data-plane caller: its secret and the record it runs as."""

    __slots__ = ("_expected", "key")

    def __init__(self, admin_key: str, key: ApiKey) -> None:
        self._expected = admin_key.encode()
        self.key = key

    def matches(self, secret: str) -> bool:
        return hmac.compare_digest(secret.encode(), self._expected)


def admin_identity(settings: Settings) -> AdminIdentity | None:
    """The admin key as a data-plane caller (it runs everything there too, as QueryAPIGate's);
    None without an admin key."""
    return AdminIdentity(settings.admin_key, ApiKey.admin()) if settings.admin_key else None


def identify(secret: str | None, catalog: Catalog, admin: AdminIdentity | None = None, *, ip: str) -> ApiKey:
    """The key ``secret`` names, used from ``ip`` (the client address; an unknown one, empty,
    is in no key's ``allowed_ips``)."""
    if not secret:
        raise unauthorized("missing API key (send it as X-API-Key)")
    prefix = crypto.secret_prefix(secret)
    record = catalog.keys.get(prefix) if prefix is not None else None
    if record is None:
        if admin is not None and admin.matches(secret):
            return admin.key
        raise unauthorized()
    if prefix == record.prefix:
        if not crypto.matches(secret, record.digest):
            raise unauthorized()
    elif not (crypto.matches(secret, record.previous_digest) and time.time() < record.previous_until):
        raise unauthorized()
    if not record.active:
        raise unauthorized()
    if record.expires_at is not None and record.expired(time.time()):
        raise GatewayError(401, "key_expired", "this API key has expired")
    if record.governance.allowed_ips is not None:
        record.governance.check_ip(ip)
    return record
