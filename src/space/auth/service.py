"""Users, tokens, and who is calling: the principal, and their membership in the org of the request."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from space.auth.models import ApiToken, User
from space.auth.tokens import hash_token, new_token
from space.errors import Conflict, NotFound, Unauthenticated

# RFC 9110 §11.6.1: a 401 names the scheme that would work.
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="space"'}


@dataclass(frozen=True)
class Principal:
    """The authenticated caller."""

    user_id: uuid.UUID
    email: str
    name: str
    token_id: uuid.UUID | None = None
    """The bearer token the caller authenticated with (None for a download link's user)."""


def bearer_hash(authorization: str | None) -> bytes:
    """The stored form of the token `Authorization: Bearer <token>` carries; no or another header is 401."""
    if not authorization:
        raise Unauthenticated("Missing bearer token.", headers=dict(_CHALLENGE))
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 200:
        raise Unauthenticated("Expected 'Authorization: Bearer <token>'.", headers=dict(_CHALLENGE))
    return hash_token(token)


def unknown_token() -> Unauthenticated:
    """The 401 of a bearer token that is not (or no longer) anyone's."""
    return Unauthenticated("Unknown or revoked token.", headers=dict(_CHALLENGE))


async def authenticate(session: AsyncSession, authorization: str | None) -> Principal:
    """Resolve `Authorization: Bearer <token>` to a user; anything else is 401."""
    token_hash = bearer_hash(authorization)
    row = (
        await session.execute(
            select(User.id, User.email, User.name, ApiToken.id.label("token_id"))
            .join(ApiToken, ApiToken.user_id == User.id)
            .where(ApiToken.token_hash == token_hash, ApiToken.revoked_at.is_(None))
        )
    ).one_or_none()
    if row is None:
        raise unknown_token()
    return Principal(user_id=row.id, email=row.email, name=row.name, token_id=row.token_id)


async def create_user(session: AsyncSession, email: str, name: str) -> User:
    """Add a user; the email is stored lower-cased and must be new, or a restore's placeholder for it (SPEC §23),
    which this claims: it gets the name, and the memberships the restore gave it are the new user's."""
    email = email.strip().lower()
    existing = (await session.execute(select(User).where(User.email == email))).scalar_one_or_none()
    if existing is not None and existing.placeholder:
        await session.execute(update(User).where(User.id == existing.id).values(name=name.strip(), placeholder=False))
        await session.refresh(existing)
        return existing
    if existing is not None:
        raise Conflict(f"A user with email {email} already exists.")
    user = User(id=uuid.uuid4(), email=email, name=name.strip())
    session.add(user)
    await session.flush()
    return user


async def user_by_email(session: AsyncSession, email: str) -> User:
    """The user with this email, or NotFound."""
    user = (await session.execute(select(User).where(User.email == email.strip().lower()))).scalar_one_or_none()
    if user is None:
        raise NotFound(f"No user with email {email}.")
    return user


async def ensure_user(session: AsyncSession, email: str, name: str) -> User:
    """The user with this email, created with `name` if there is none yet."""
    try:
        return await user_by_email(session, email)
    except NotFound:
        return await create_user(session, email, name)


async def issue_token(session: AsyncSession, user_id: uuid.UUID) -> str:
    """Create a token for the user and return it; only its hash is stored."""
    token = new_token()
    session.add(ApiToken(id=uuid.uuid4(), user_id=user_id, token_hash=hash_token(token)))
    await session.flush()
    return token


async def revoke_tokens(session: AsyncSession, user_id: uuid.UUID) -> int:
    """Revoke every live token of the user; returns how many."""
    result = await session.execute(
        update(ApiToken).where(ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None)).values(revoked_at=func.now())
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
