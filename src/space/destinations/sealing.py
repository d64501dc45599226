"""A destination's secret, sealed at rest: AES-256-GCM (`cryptography`'s AEAD) under a key derived with HKDF-SHA256
from the signing keys (SPEC §10), its associated data the org id and the destination id.

The associated data binds a sealed secret to its row: copied into another org's or destination's row it no
longer opens. Keys rotate as the signing keys do (`SPACE_SECRET_KEY`, comma-separated): the first key seals, every
key opens; a sealed value names the key that sealed it by a short fingerprint of the derived key (never the key),
so opening tries only that one. Without `SPACE_SECRET_KEY` the key is the one `space migrate` keeps in the
database (`signing_keys`): a dump of that database then holds both, which `space check` should say (decision 0100).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from space.config import Settings

VERSION = b"\x01"
INFO = b"space destination secret v1"
"""HKDF's `info`: keys for this purpose are never the link-signing keys themselves."""
NONCE_BYTES = 12
FINGERPRINT_BYTES = 8


class SealError(Exception):
    """A sealed secret that no key opens (a key removed from SPACE_SECRET_KEY, or a tampered row)."""


def _derive(signing_key: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=INFO).derive(signing_key)


def _associated(org_id: uuid.UUID, destination_id: uuid.UUID) -> bytes:
    return b"space-destination:" + org_id.bytes + destination_id.bytes


class Sealer:
    """Seals with the first signing key's derived key, opens with whichever key sealed."""

    def __init__(self, signing_keys: Sequence[bytes]) -> None:
        # Here, not at the top: every worker imports this module, and cryptography is megabytes it needs only
        # once a delivery runs (tests/test_packaging.py).
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if not signing_keys:
            raise SealError("no signing key")
        derived = [_derive(k) for k in signing_keys]
        self._keys = [(hashlib.sha256(d).digest()[:FINGERPRINT_BYTES], AESGCM(d)) for d in derived]

    def seal(self, secret: str, org_id: uuid.UUID, destination_id: uuid.UUID) -> bytes:
        """`secret` sealed for this org's destination: version, key fingerprint, nonce, ciphertext and tag."""
        fingerprint, aead = self._keys[0]
        nonce = os.urandom(NONCE_BYTES)
        sealed = aead.encrypt(nonce, secret.encode(), _associated(org_id, destination_id))
        return VERSION + fingerprint + nonce + sealed

    def open(self, sealed: bytes, org_id: uuid.UUID, destination_id: uuid.UUID) -> str:
        """The secret; SealError when no key of this deployment sealed it or the row was changed."""
        sealed = bytes(sealed)
        head = 1 + FINGERPRINT_BYTES
        if sealed[:1] != VERSION or len(sealed) < head + NONCE_BYTES:
            raise SealError("not a sealed secret")
        from cryptography.exceptions import InvalidTag

        fingerprint, nonce, body = sealed[1:head], sealed[head : head + NONCE_BYTES], sealed[head + NONCE_BYTES :]
        for known, aead in self._keys:
            if known == fingerprint:
                try:
                    return aead.decrypt(nonce, body, _associated(org_id, destination_id)).decode()
                except InvalidTag:
                    break
        raise SealError("the destination's secret can't be opened with this deployment's keys")


async def load_sealer(settings: Settings, engine: AsyncEngine) -> Sealer:
    """The deployment's sealer: SPACE_SECRET_KEY's keys, else the key kept in the database (as the link signer's)."""
    if settings.secret_key:
        return Sealer([k.strip().encode() for k in settings.secret_key.split(",")])
    async with engine.connect() as conn:
        secret = await conn.scalar(text("SELECT secret FROM signing_keys WHERE id = 1"))
    if secret is None:
        raise SealError("no signing key in the database: run `space migrate`")
    return Sealer([bytes(secret)])
