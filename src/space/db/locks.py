"""Transaction-scoped advisory locks: they order checks that no single row lock covers.

- `lock_user`: a user's limits that span orgs (exports across orgs, orgs owned). Two requests of one user in
  different orgs hold different org locks; this lock orders their counts. Taken after the org lock
  (`orgs.service.lock_org`) when a transaction needs both, never before, so two such transactions can't
  wait on each other in a cycle.
- `lock_org_claims`: an org's export claims, so counting its running exports and claiming one is atomic.
  Deliberately not the org row lock: publishes, role changes and lifecycle transitions hold that one, and a
  claim need not wait for them.

- `lock_link_audit`: one download link's ranged requests, so "was one audited in the last minute" and the
  row that answers no are one step (two concurrent ranges of a link write one row).
- `lock_org_outbound`: an org's outbound claims (`space.outbox`, every channel), so counting its attempts in
  flight and claiming one more is atomic; `lock_user_outbound` the same for a person's rows of no org.

All use PostgreSQL's two-key form (`pg_advisory_xact_lock(int, int)`) with a key space of their own as the
first key (SAQ's Postgres queue uses key space 0), and end with the transaction.
"""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

USER_LIMITS = 0x53500001
"""Key space of `lock_user`."""
ORG_CLAIMS = 0x53500002
"""Key space of `lock_org_claims`."""
LINK_AUDIT = 0x53500003
"""Key space of `lock_link_audit`."""
ORG_OUTBOUND = 0x53500004
"""Key space of `lock_org_outbound`."""
USER_OUTBOUND = 0x53500005
"""Key space of `lock_user_outbound`."""

# hashtext maps the id onto the second int4 key; two ids that collide only share a lock, which is safe.
_LOCK = "SELECT pg_advisory_xact_lock({space}, hashtext(:id))"


async def lock_user(session: AsyncSession, user_id: uuid.UUID) -> None:
    """Wait for, then hold until commit, the lock over this user's cross-org limits."""
    await session.execute(text(_LOCK.format(space=USER_LIMITS)), {"id": str(user_id)})


async def lock_org_claims(session: AsyncSession, org_id: uuid.UUID) -> None:
    """Wait for, then hold until commit, the lock over this org's export claims."""
    await session.execute(text(_LOCK.format(space=ORG_CLAIMS)), {"id": str(org_id)})


async def lock_link_audit(session: AsyncSession, link_id: str) -> None:
    """Wait for, then hold until commit, the lock over one link's ranged-request audit rows."""
    await session.execute(text(_LOCK.format(space=LINK_AUDIT)), {"id": link_id})


async def lock_org_outbound(session: AsyncSession, org_id: uuid.UUID) -> None:
    """Wait for, then hold until commit, the lock over this org's outbound claims (every outbox channel)."""
    await session.execute(text(_LOCK.format(space=ORG_OUTBOUND)), {"id": str(org_id)})


async def lock_user_outbound(session: AsyncSession, user_id: uuid.UUID) -> None:
    """Wait for, then hold until commit, the lock over this user's outbound claims of rows of no org."""
    await session.execute(text(_LOCK.format(space=USER_OUTBOUND)), {"id": str(user_id)})
