"""One database with an org of 1,000,000 tickets and 1,000,000 projects and tasks, shared by the suite's two
million-row scenarios (the archive's flat memory, the search's index): seeding it is most of their time.

It is seeded at revision 0004, before the trigram indexes of 0005, and then migrated to head: the indexes are
built in bulk, as on an existing deployment (and far faster than a million incremental GIN inserts each).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from sqlalchemy import text

from space.db import Tenant, UnitOfWork
from space.db.migrate import upgrade
from space.demo import DemoUser, seed_org
from tests.exports.fixtures import add_tickets
from tests.helpers import TestUser, app_database, fresh_database

TICKETS = 1_000_000
TASKS = 999_980
"""With its 20 projects (space.demo), the snapshot part has 1,000,000 rows."""
RARE = "Xylophonique"
"""The word the search looks for: in two titles and one body among the million, and almost in one more."""


@dataclass(frozen=True)
class Million:
    """The database (owner URL), the big org and a small one (their people), and the search's known tickets."""

    url: str
    big_id: uuid.UUID
    big: list[DemoUser]
    small: list[DemoUser]
    hits: list[int]
    """The numbers of the tickets that contain RARE (title or body), in order."""
    tickets: int
    """The big org's tickets: the seeded million and the search's four."""


@pytest.fixture(scope="session")
async def million(owner_url: str) -> AsyncIterator[Million]:
    with fresh_database(owner_url, "space_million", revision="0004") as url:
        async with app_database(url, "space-tests-million-seed") as db:
            small = await seed_org(db, "Small", tickets=1_000, tasks=200)
            big = await seed_org(db, "Big", tickets=TICKETS, tasks=TASKS)
            member = next(p for p in big if p.role == "member")
            async with UnitOfWork(db.sessionmaker) as uow:
                creator = await uow.session.scalar(text("SELECT id FROM users WHERE email = :e"), {"e": member.email})
            # A user reads their own memberships through app.user_id.
            async with UnitOfWork(db.sessionmaker, Tenant(user_id=creator)) as uow:
                org_id = await uow.session.scalar(
                    text("SELECT org_id FROM memberships WHERE user_id = :u"), {"u": creator}
                )
            assert org_id is not None and creator is not None
            who = TestUser(creator, member.email, "", member.token)
            # A few matches among a million: in titles, in a body, in other cases; and one near miss.
            hits = await add_tickets(db, org_id, who, [f"printer {RARE} jam", f"{RARE.upper()}!"])
            hits += await add_tickets(db, org_id, who, ["plain"], body=f"see {RARE.lower()} log")
            await add_tickets(db, org_id, who, ["Xylophoni que"], body="Xylophoniqu e")
        upgrade(url)
        yield Million(url, org_id, big, small, hits, TICKETS + 4)
