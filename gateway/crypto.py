"""Secrets at rest: API keys are stored only as a SHA-256 digest; connection passwords
are sealed with AES-GCM under a key derived from ``GATEWAY_SECRET_KEY``.

API key secrets look like ``gw_<prefix>_<random>``. The prefix is public and finds the
record; the digest of the whole secret is then compared in constant time, so a lookup
never leaks how much of a guess was right.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import conflict

_SEALED_PREFIX = "v1:"
_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def new_api_secret() -> tuple[str, str]:
    """A fresh key secret and its public prefix."""
    prefix = secrets.token_hex(6)
    return f"gw_{prefix}_{secrets.token_urlsafe(32)}", prefix


def secret_prefix(secret: str) -> str | None:
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != "gw":
        return None
    return parts[1]


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def matches(secret: str, stored_digest: bytes) -> bool:
    return hmac.compare_digest(digest(secret), stored_digest)


class PasswordBox:
    """Seals and opens connection passwords. ``${VAR}`` references are kept as written
    and resolved from the server's environment when a session is opened."""

    __slots__ = ("_aead",)

    def __init__(self, secret_key: str) -> None:
        if not secret_key:
            raise ValueError("GATEWAY_SECRET_KEY is required to store connection passwords")
        self._aead = AESGCM(hashlib.sha256(secret_key.encode()).digest())

    def seal(self, password: str | None) -> str | None:
        if password is None or password == "":
            return password
        if _ENV_REF.match(password):
            return password
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, password.encode(), b"connection-password")
        return _SEALED_PREFIX + base64.b64encode(nonce + sealed).decode()

    def open(self, stored: str | None) -> str | None:
        if not stored:
            return stored
        ref = _ENV_REF.match(stored)
        if ref:
            return os.environ.get(ref.group(1), "")
        if not stored.startswith(_SEALED_PREFIX):
            return stored
        try:
            raw = base64.b64decode(stored[len(_SEALED_PREFIX):], validate=True)
            return self._aead.decrypt(raw[:12], raw[12:], b"connection-password").decode()
        except (InvalidTag, ValueError):   # sealed under another GATEWAY_SECRET_KEY, or damaged
            raise conflict("connection_password_unreadable", "the connection's stored password cannot be opened "
                           "with this server's GATEWAY_SECRET_KEY; set it again") from None
