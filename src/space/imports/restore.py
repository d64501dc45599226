"""Restore (SPEC §23): a checked archive becomes a new organization, in the caller's one transaction.

`plan` decides, before anything is written: which members' emails have a user here (matched) and which get a
placeholder user, and which project, task and membership ids are in use anywhere in the installation (read
through `space_import_ids_in_use`, RLS hiding other orgs). Projects and tasks in use refuse the import
(`IdsInUse`) unless `newIds` maps them; memberships in use are always mapped. A dry run stops at the plan.

`write` then makes the org (the importer its owner), its ticket counter, and every row with COPY
(`cursor.copy`, rows written as tuples) as the app role under the new org's RLS context. PostgreSQL has no COPY
FROM into a table under RLS: each table's rows are copied into a temporary table, then moved with one
INSERT ... SELECT that the policies check (docs/decisions/0098-restore.md).
"""

from __future__ import annotations

import contextlib
import uuid
import zipfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import text

from space.db import Tenant, UnitOfWork, driver_connection
from space.db.locks import lock_user
from space.errors import Conflict, OrgLimitReached
from space.exports.formats.datafiles import PROJECTS, TASKS, TICKETS
from space.imports.reading import Checked, lines
from space.orgs import service as orgs

_CHECK_BATCH = 5000
PROGRESS_EVERY = 20_000


class IdsInUse(Conflict):
    code, title = "ids_in_use", "The archive's ids are in use here"


@dataclass
class Plan:
    """What a restore will do: the maps from the archive's ids to this installation's, and who is who."""

    importer: uuid.UUID
    importer_email: str
    users: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)
    placeholders: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)
    """Archive user id -> the id of the placeholder user to make."""
    matched: list[str] = field(default_factory=list)
    placeholder_emails: list[str] = field(default_factory=list)
    ids: dict[str, dict[uuid.UUID, uuid.UUID]] = field(default_factory=lambda: {"project": {}, "task": {}})
    memberships: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)
    in_use: int = 0
    creators_reassigned: int = 0
    """Tickets whose creator was no member of the archive: the importer is their creator here."""

    def id_map(self) -> dict[str, dict[str, str]]:
        """The report's map: archive id -> new id, for every id that was not kept."""
        kinds = {"projects": self.ids["project"], "tasks": self.ids["task"], "memberships": self.memberships}
        return {k: {str(a): str(b) for a, b in m.items()} for k, m in kinds.items() if m}


async def _in_use(conn: psycopg.AsyncConnection[Any], ids: Iterable[uuid.UUID]) -> set[uuid.UUID]:
    found: set[uuid.UUID] = set()
    batch: list[uuid.UUID] = []

    async def ask() -> None:
        cur = await conn.execute("SELECT id FROM space_import_ids_in_use(%s::uuid[])", [batch])
        found.update(row[0] for row in await cur.fetchall())
        batch.clear()

    for one in ids:
        batch.append(one)
        if len(batch) >= _CHECK_BATCH:
            await ask()
    if batch:
        await ask()
    return found


async def plan(uow: UnitOfWork, archive: zipfile.ZipFile, checked: Checked, new_ids: bool, email: str) -> Plan:
    """Who is matched, who gets a placeholder, which ids are mapped; IdsInUse when projects or tasks are taken."""
    assert uow.tenant.user_id is not None
    result = Plan(uow.tenant.user_id, email.strip().lower())
    conn = await driver_connection(uow.session)
    emails = [m.email.strip().lower() for m in checked.members]
    cur = await conn.execute("SELECT email, id FROM users WHERE email = ANY(%s)", [emails])
    here = {row[0]: row[1] for row in await cur.fetchall()}
    taken = {
        row[0]
        for row in await (
            await conn.execute(
                "SELECT id FROM users WHERE id = ANY(%s::uuid[])", [[m.user_id for m in checked.members]]
            )
        ).fetchall()
    }
    for member, address in zip(checked.members, emails, strict=True):
        if address in here:
            result.users[member.user_id] = here[address]
            result.matched.append(address)
        else:
            result.placeholders[member.user_id] = member.user_id if member.user_id not in taken else uuid.uuid4()
            result.users[member.user_id] = result.placeholders[member.user_id]
            result.placeholder_emails.append(address)
    projects = await _in_use(conn, checked.project_ids)
    tasks = await _in_use(conn, (t.id for t in lines(archive, TASKS)))
    result.in_use = len(projects) + len(tasks)
    if result.in_use and not new_ids:
        raise IdsInUse(
            f"{len(projects)} project and {len(tasks)} task ids of the archive are in use in this installation"
            " (is the original organization still here?). Ask again with newIds=true to give them new ids."
        )
    result.ids["project"] = {old: uuid.uuid4() for old in sorted(projects)}
    result.ids["task"] = {old: uuid.uuid4() for old in sorted(tasks)}
    members = await _in_use(conn, (m.membership_id for m in checked.members))
    result.memberships = {old: uuid.uuid4() for old in sorted(members)}
    return result


@contextlib.asynccontextmanager
async def _staged(cur: psycopg.AsyncCursor[Any], table: str, columns: str) -> AsyncIterator[psycopg.AsyncCopy]:
    """A COPY into `table`: PostgreSQL refuses COPY FROM into a table under RLS, so the rows go by COPY into a
    temporary table of the same columns, then by one INSERT ... SELECT, which RLS checks (WITH CHECK)."""
    stage = f"pg_temp.import_{table}"
    await cur.execute(f"CREATE TEMP TABLE import_{table} ON COMMIT DROP AS SELECT {columns} FROM {table} WITH NO DATA")
    async with cur.copy(f"COPY {stage} ({columns}) FROM STDIN") as copy:
        yield copy
    await cur.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {stage}")
    await cur.execute(f"DROP TABLE {stage}")


async def write(
    uow: UnitOfWork,
    archive: zipfile.ZipFile,
    checked: Checked,
    plan_: Plan,
    name: str,
    max_owned: int,
    progress: Callable[[int], Awaitable[None]],
) -> uuid.UUID:
    """Make the org and COPY every row into it; returns the new org's id. Progress: rows written so far."""
    session = uow.session
    await lock_user(session, plan_.importer)
    created = await orgs.created_orgs(session, plan_.importer)
    if created >= max_owned:
        raise OrgLimitReached(f"You created {created} organizations; at most {max_owned} are allowed.")
    conn = await driver_connection(session)
    for member in checked.members:
        if member.user_id in plan_.placeholders:
            await conn.execute(
                "INSERT INTO users (id, email, name, placeholder) VALUES (%s, %s, %s, true)",
                [plan_.placeholders[member.user_id], member.email.strip().lower(), member.name],
            )
    org_id = uuid.uuid4()
    await uow.retenant(Tenant(org_id=org_id, user_id=plan_.importer))
    await session.execute(
        text("INSERT INTO organizations (id, name, state, created_by) VALUES (:id, :name, 'active', :me)"),
        {"id": org_id, "name": name, "me": plan_.importer},
    )
    await session.execute(text("INSERT INTO ticket_counters (org_id, last_number) VALUES (:org, 0)"), {"org": org_id})
    done = 0

    async def step(n: int) -> None:
        nonlocal done
        done += n
        if done % PROGRESS_EVERY == 0:
            await progress(done)

    importer_in = False
    membership = plan_.memberships
    async with conn.cursor() as cur, _staged(cur, "memberships", "org_id, id, user_id, role") as copy:
        for m in checked.members:
            user = plan_.users[m.user_id]
            role = m.role
            if user == plan_.importer:
                importer_in, role = True, "owner"
            await copy.write_row((org_id, membership.get(m.membership_id, m.membership_id), user, role))
            await step(1)
        if not importer_in:
            await copy.write_row((org_id, uuid.uuid4(), plan_.importer, "owner"))
    async with conn.cursor() as cur:
        pmap, tmap = plan_.ids["project"], plan_.ids["task"]
        columns = "org_id, id, name, version, deleted_at, created_at, updated_at"
        async with _staged(cur, "projects", columns) as copy:
            for p in lines(archive, PROJECTS):
                await copy.write_row(
                    (org_id, pmap.get(p.id, p.id), p.name, p.version, p.deleted_at, p.created_at, p.updated_at)
                )
                await step(1)
        columns = "org_id, id, project_id, title, status, due_date, created_at, updated_at"
        async with _staged(cur, "tasks", columns) as copy:
            for t in lines(archive, TASKS):
                project = pmap.get(t.project_id, t.project_id)
                row = (org_id, tmap.get(t.id, t.id), project, t.title, t.status, t.due_date, t.created_at, t.updated_at)
                await copy.write_row(row)
                await step(1)
        columns = "org_id, id, number, title, body, status, priority, creator_id, assignee_id, created_at, updated_at"
        users, importer = plan_.users, plan_.importer
        async with _staged(cur, "tickets", columns) as copy:
            for k in lines(archive, TICKETS):
                assignee = None if k.assignee_id is None else membership.get(k.assignee_id, k.assignee_id)
                creator = users.get(k.creator_id)
                if creator is None:
                    creator = importer
                    plan_.creators_reassigned += 1
                await copy.write_row(
                    (
                        org_id,
                        uuid.uuid4(),
                        k.number,
                        k.title,
                        k.body,
                        k.status,
                        k.priority,
                        creator,
                        assignee,
                        k.created_at,
                        k.updated_at,
                    )
                )
                await step(1)
    await session.execute(
        text(
            "UPDATE ticket_counters SET last_number = coalesce((SELECT max(number) FROM tickets WHERE org_id = :org), 0)"
            " WHERE org_id = :org"
        ),
        {"org": org_id},
    )
    return org_id
