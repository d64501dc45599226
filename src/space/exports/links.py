"""Download links (SPEC §10): a short-lived token, signed over who may download which execution of which export.

A browser can't send an Authorization header, so `POST .../links` mints a URL whose `token=` stands in for it.
The token is a JWT (PyJWT) signed with HMAC-SHA256: the algorithm list is fixed to HS256 when verifying, so a
token can't choose its own algorithm (`none`, or an asymmetric one with the key as a "public key"), and PyJWT
compares signatures with `hmac.compare_digest`. It proves only who asked and what for, until when: the result
route authorizes its user again, in SPEC §6's order, at every use.

A token also names the bearer token it was minted with (`tok`, that token's row id, not the token): the user
lookup of every use requires that token to be unrevoked, so `space tokens revoke` ends every link minted before
it at once (SPEC §25), with no clock to compare and in the round trip that already finds the user.

Keys: `SPACE_SECRET_KEY` (comma-separated: the first signs, every one verifies, so a key can be rotated in
without breaking the links minted a minute before), else the key `space migrate` made and keeps in the
`signing_keys` table (migration 0007), read once when the API starts, so every host shares it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from space.config import Settings
from space.errors import LinkExpired, LinkInvalid

PURPOSE = "export-download"
"""What a link token is for; a token signed for anything else is never a download link."""
ALGORITHM = "HS256"
VERIFIED_KEPT = 1024
"""Verified tokens a signer remembers (about half a KiB each), the oldest dropped first."""
MAX_TOKEN_CHARS = 2000
"""Longer `token=` values are refused before any parsing (a real one is about 400 characters)."""
_CLAIMS = ["pur", "sub", "org", "export", "execution", "exp", "tok"]


class NoSigningKey(RuntimeError):
    """Neither SPACE_SECRET_KEY nor a key in the database: the schema predates migration 0007."""


@dataclass(frozen=True)
class LinkGrant:
    """What a link token says: this user may try to download this execution of this export until `expires_at`."""

    user_id: uuid.UUID
    org_id: uuid.UUID
    export_id: uuid.UUID
    execution_id: uuid.UUID
    expires_at: int
    """Seconds since the epoch (JWT's `exp`)."""
    token_id: uuid.UUID
    """The bearer token the link was minted with: the link works while that token is not revoked."""
    link_id: str = ""
    """Names this link in the audit trail (a digest of the token, never the token); set by `verify`."""

    @property
    def expires(self) -> dt.datetime:
        """`expires_at` as an aware datetime."""
        return dt.datetime.fromtimestamp(self.expires_at, dt.UTC)


class LinkSigner:
    """Signs link tokens with the first key and verifies them with any key."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise NoSigningKey("no signing key")
        self._keys = tuple(keys)
        self._verified: dict[str, LinkGrant] = {}
        """Tokens whose signature and claims checked out, with what they say: a resumed or segmented download sends
        one token hundreds of times, and its signature can't change. Expiry and path are checked at every use."""

    def sign(self, grant: LinkGrant) -> str:
        """The token of `grant`."""
        claims = {
            "pur": PURPOSE,
            "sub": str(grant.user_id),
            "org": str(grant.org_id),
            "export": str(grant.export_id),
            "execution": str(grant.execution_id),
            "exp": grant.expires_at,
            "tok": str(grant.token_id),
            # Each mint is a link of its own (two in one second would otherwise be the same token): one link's
            # ranged requests share one audit row a minute, another link's have theirs.
            "jti": uuid.uuid4().hex,
        }
        import jwt  # here, not at the top: the worker imports this module and never signs (PyJWT loads cryptography)

        return jwt.encode(claims, self._keys[0], algorithm=ALGORITHM)

    def verify(self, token: str, org_id: str, export_id: str) -> LinkGrant:
        """The grant of a token for the export of this path; LinkExpired or LinkInvalid otherwise.

        The signature is checked before the expiry (PyJWT's order), so only a genuine token is ever "expired".
        """
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise LinkInvalid()
        grant = self._verified.get(token)
        if grant is None:
            grant = self._decode(token)
            self._verified[token] = grant
            if len(self._verified) > VERIFIED_KEPT:
                del self._verified[next(iter(self._verified))]  # the oldest
        elif grant.expires_at <= time.time():  # PyJWT's rule: expired at `exp` itself
            raise LinkExpired()
        if not (_same(grant.org_id, org_id) and _same(grant.export_id, export_id)):
            raise LinkInvalid()
        return grant

    def _decode(self, token: str) -> LinkGrant:
        """The grant of a token whose signature, expiry and purpose check out; LinkExpired or LinkInvalid."""
        import jwt  # as in `sign`

        for key in self._keys:
            try:
                claims = jwt.decode(token, key, algorithms=[ALGORITHM], options={"require": _CLAIMS})
            except jwt.InvalidSignatureError:
                continue  # perhaps signed with another of the keys
            except jwt.ExpiredSignatureError:
                raise LinkExpired() from None
            except jwt.PyJWTError:
                raise LinkInvalid() from None
            break
        else:
            raise LinkInvalid()
        try:
            grant = LinkGrant(
                user_id=uuid.UUID(claims["sub"]),
                org_id=uuid.UUID(claims["org"]),
                export_id=uuid.UUID(claims["export"]),
                execution_id=uuid.UUID(claims["execution"]),
                expires_at=int(claims["exp"]),
                token_id=uuid.UUID(claims["tok"]),
                link_id=hashlib.sha256(token.encode()).hexdigest()[:32],
            )
        except (TypeError, ValueError, AttributeError):
            raise LinkInvalid() from None
        if claims["pur"] != PURPOSE:
            raise LinkInvalid()
        return grant


def _same(claimed: uuid.UUID, path_id: str) -> bool:
    try:
        return claimed == uuid.UUID(path_id)
    except ValueError:
        return False


async def load_signer(settings: Settings, engine: AsyncEngine) -> LinkSigner:
    """The deployment's signer: SPACE_SECRET_KEY's keys, else the key kept in the database."""
    if settings.secret_key:
        return LinkSigner([k.strip().encode() for k in settings.secret_key.split(",")])
    async with engine.connect() as conn:
        secret = await conn.scalar(text("SELECT secret FROM signing_keys WHERE id = 1"))
    if secret is None:
        raise NoSigningKey("no download-link signing key in the database: run `space migrate`")
    return LinkSigner([bytes(secret)])
