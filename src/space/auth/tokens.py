"""Opaque bearer tokens: 32 random bytes shown once, stored as SHA-256."""

from __future__ import annotations

import hashlib
import secrets

TOKEN_BYTES = 32
PREFIX = "spc_"


def new_token() -> str:
    """A fresh random token (>= 32 bytes of entropy)."""
    return PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str) -> bytes:
    """The stored form. A fast hash is enough: tokens are random, not passwords."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
