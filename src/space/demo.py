"""Demo and benchmark data: two orgs with people of every role, projects, tasks and tricky tickets.

Bulk rows are written set-based (INSERT ... SELECT FROM generate_series) in batches, as the app role
under each org's tenant context, tasks and tickets side by side: a million tickets take well under half a
minute, not hours (PostgreSQL computes their stored CSV text on the way, see migration 0004).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import insert, select, text

from space.auth import service as auth
from space.db import Database, Tenant, UnitOfWork
from space.errors import NotFound
from space.orgs.models import Membership, Organization, OrgState, Role
from space.tickets.models import TicketCounter

# Titles that break naive CSV writers and spreadsheets: commas, quotes, newlines, formula starts.
TRICKY_TITLES = [
    "Printer on fire, again",
    'He said "it works on my machine"',
    "Line one\nline two",
    '=HYPERLINK("http://evil.example","click")',
    "+1 for dark mode",
    "-2 stars; refund please",
    "@channel outage",
    "\tTabbed start",
    "\uff1dSUM(A1:A9) full-width",
    "\u00a0=1+1 after a no-break space",
    "Café ☕ crème brûlée; naïve façade",
    "Semicolon; separated; words",
    'Quote "inside", comma, and\r\nCRLF',
    "Plain old ticket",
]
PRIORITIES = ["low", "normal", "high", "urgent"]
STATUSES = ["open", "pending", "solved", "closed"]
ROLES = [("owner", Role.owner), ("admin", Role.admin), ("member", Role.member), ("customer1", Role.customer),
         ("customer2", Role.customer)]  # fmt: skip

Progress = Callable[[int], None]


@dataclass
class DemoUser:
    """A demo person and a fresh token."""

    org: str
    role: str
    email: str
    token: str
    org_id: uuid.UUID


@dataclass
class DemoOrg:
    """A demo org, whether this run made it (`created`) or found it, and its people with fresh tokens."""

    name: str
    id: uuid.UUID
    created: bool
    people: list[DemoUser]


async def _user(db: Database, email: str, name: str) -> tuple[uuid.UUID, str]:
    async with UnitOfWork(db.sessionmaker) as uow:
        user = await auth.ensure_user(uow.session, email, name)
        token = await auth.issue_token(uow.session, user.id)
    return user.id, token


def _email(org: str, key: str) -> str:
    return f"{key}@{org.lower()}.example"


async def _person(db: Database, org: str, key: str, org_id: uuid.UUID) -> tuple[DemoUser, uuid.UUID]:
    """The demo person `key` of `org` (created the first time) with a fresh token."""
    email = _email(org, key)
    uid, token = await _user(db, email, f"{org} {key.capitalize()}")
    return DemoUser(org, key, email, token, org_id), uid


async def _earlier_demo_org(db: Database, name: str) -> uuid.UUID | None:
    """The org `name` an earlier run made: its demo owner owns an org of that name that is not deleted."""
    async with UnitOfWork(db.sessionmaker) as uow:
        try:
            owner = await auth.user_by_email(uow.session, _email(name, "owner"))
        except NotFound:
            return None
    # RLS shows a user the orgs they are a member of: the owner's tenant context finds theirs.
    async with UnitOfWork(db.sessionmaker, Tenant(user_id=owner.id)) as uow:
        found: uuid.UUID | None = await uow.session.scalar(
            select(Organization.id)
            .join(Membership, Membership.org_id == Organization.id)
            .where(
                Membership.user_id == owner.id,
                Membership.role == Role.owner.value,
                Organization.name == name,
                Organization.state != OrgState.deleted.value,
            )
            .order_by(Organization.created_at, Organization.id)
            .limit(1)
        )
    return found


async def demo_org(db: Database, name: str, *, tickets: int, tasks: int, progress: Progress | None = None) -> DemoOrg:
    """The demo org `name`: the one an earlier run made, untouched, or a new one seeded; fresh tokens either way.

    `space demo` run twice gives the same orgs and people, not a second North (runs at the same moment may still
    both create it: a demo is not a concurrent workload)."""
    org_id = await _earlier_demo_org(db, name)
    if org_id is None:
        people = await seed_org(db, name, tickets=tickets, tasks=tasks, progress=progress)
        return DemoOrg(name, people[0].org_id, True, people)
    found = [(await _person(db, name, key, org_id))[0] for key, _role in ROLES]
    if progress:
        progress(tickets + tasks)
    return DemoOrg(name, org_id, False, found)


async def seed_org(
    db: Database,
    name: str,
    *,
    tickets: int,
    tasks: int,
    progress: Progress | None = None,
    titles: list[str] | None = None,
    record_creator: bool = True,
) -> list[DemoUser]:
    """Create org `name` with one person per role, projects, tasks and tickets; return the people's tokens.

    `titles` replaces the tricky titles of tasks and tickets (the benchmark's wide rows). `record_creator=False`
    leaves `organizations.created_by` out of the insert, for a database seeded at a revision before 0015."""
    org_id = uuid.uuid4()
    people: dict[str, uuid.UUID] = {}
    out: list[DemoUser] = []
    for key, _role in ROLES:
        person, uid = await _person(db, name, key, org_id)
        people[key] = uid
        out.append(person)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        s = uow.session
        org = {"id": org_id, "name": name} | ({"created_by": people["owner"]} if record_creator else {})
        await s.execute(insert(Organization).values(org))
        members = {key: Membership(id=uuid.uuid4(), org_id=org_id, user_id=people[key], role=role.value)
                   for key, role in ROLES}  # fmt: skip
        s.add_all(members.values())
        s.add(TicketCounter(org_id=org_id, last_number=0))
        await s.flush()
    staff = [members[k].id for k in ("owner", "admin", "member")]
    creators = [people[k] for k, _ in ROLES]
    # Tasks and tickets are independent: two connections fill them side by side.
    await asyncio.gather(
        bulk_projects_and_tasks(
            db, org_id, projects=max(1, min(20, tasks // 10 or 1)), tasks=tasks, progress=progress, titles=titles
        ),
        bulk_tickets(db, org_id, tickets, creators=creators, assignees=staff, progress=progress, titles=titles),
    )
    return out


async def bulk_projects_and_tasks(
    db: Database,
    org_id: uuid.UUID,
    *,
    projects: int,
    tasks: int,
    progress: Progress | None = None,
    batch: int = 100_000,
    titles: list[str] | None = None,
) -> None:
    """Insert `projects` projects and `tasks` tasks spread over them."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        await uow.session.execute(
            text(
                "INSERT INTO projects (id, org_id, name) SELECT gen_random_uuid(), :org, 'Project ' || i"
                " FROM generate_series(1, CAST(:n AS int)) AS i"
            ),
            {"org": org_id, "n": projects},
        )
    done = 0
    while done < tasks:
        n = min(batch, tasks - done)
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
            await uow.session.execute(
                text(
                    "WITH p AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS k FROM projects WHERE org_id = :org)"
                    " INSERT INTO tasks (id, org_id, project_id, title, status, due_date)"
                    " SELECT gen_random_uuid(), :org, p.id, (CAST(:titles AS text[]))[1 + i % cardinality(CAST(:titles AS text[]))] || ' #' || i,"
                    " (ARRAY['todo','doing','done'])[1 + i % 3], CASE WHEN i % 4 = 0 THEN NULL"
                    " ELSE date '2026-01-01' + (i % 365) END"
                    " FROM generate_series(CAST(:start AS int), CAST(:stop AS int)) AS i JOIN p ON p.k = i % CAST(:projects AS int)"
                ),
                {
                    "org": org_id,
                    "titles": titles or TRICKY_TITLES,
                    "start": done + 1,
                    "stop": done + n,
                    "projects": projects,
                },
            )
        done += n
        if progress:
            progress(n)


async def bulk_tickets(
    db: Database,
    org_id: uuid.UUID,
    count: int,
    *,
    creators: list[uuid.UUID],
    assignees: list[uuid.UUID],
    progress: Progress | None = None,
    batch: int = 100_000,
    titles: list[str] | None = None,
) -> None:
    """Append `count` tickets with tricky titles, numbered after the org's last number."""
    done = 0
    while done < count:
        n = min(batch, count - done)
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
            start = await uow.session.scalar(
                text("UPDATE ticket_counters SET last_number = last_number + CAST(:n AS int) WHERE org_id = :org"
                     " RETURNING last_number - CAST(:n AS int)"),
                {"n": n, "org": org_id},
            )  # fmt: skip
            await uow.session.execute(
                text(
                    "INSERT INTO tickets (id, org_id, number, title, body, status, priority, creator_id, assignee_id)"
                    " SELECT gen_random_uuid(), :org, CAST(:start AS int) + i,"
                    " (CAST(:titles AS text[]))[1 + i % cardinality(CAST(:titles AS text[]))] || ' #' || (:start + i),"
                    " 'Body of ticket ' || (:start + i), (CAST(:statuses AS text[]))[1 + i % 4], (CAST(:priorities AS text[]))[1 + (i / 4) % 4],"
                    " (CAST(:creators AS uuid[]))[1 + i % cardinality(CAST(:creators AS uuid[]))],"
                    " CASE WHEN i % 3 = 0 THEN NULL ELSE (CAST(:assignees AS uuid[]))[1 + i % cardinality(CAST(:assignees AS uuid[]))] END"
                    " FROM generate_series(1, CAST(:n AS int)) AS i"
                ),
                {
                    "org": org_id,
                    "start": start,
                    "n": n,
                    "titles": titles or TRICKY_TITLES,
                    "statuses": STATUSES,
                    "priorities": PRIORITIES,
                    "creators": creators,
                    "assignees": assignees,
                },
            )
        done += n
        if progress:
            progress(n)
