"""The notifications rows under RLS, as the app role (migration 0016): a user reads and marks read only their own
in-app rows and changes nothing else of them, preferences are each user's alone, the sweeper's function lists ids
only, and the purge takes an org's notifications with it."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.pipeline import run_export
from space.orgs.jobs import purge_due
from tests.exports.fixtures import create_export, runner, uid
from tests.helpers import Api, Org
from tests.orgs.fixtures import request_deletion


async def told(api: Api, db: Database, settings: Settings, org: Org) -> uuid.UUID:
    """The member's completed snapshot; the id of their in-app notification of it."""
    export = await create_export(api, org, org.member, {"kind": "snapshot"})
    await run_export(runner(settings, db), uid(export["id"]), uid(org.id))
    r = await api.call("GET", "/me/notifications", org.member)
    return uuid.UUID(r.json()["items"][0]["id"])


async def test_a_user_may_mark_their_own_read_and_change_nothing_else(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await api.org()
    nid = await told(api, db, settings, org)
    mine = Tenant(user_id=org.member.id)
    for column, value in (("title", "'changed'"), ("user_id", f"'{org.owner.id}'"), ("details", "'{}'")):
        with pytest.raises(DBAPIError, match="permission denied"):
            async with UnitOfWork(db.sessionmaker, mine) as uow:
                await uow.session.execute(
                    text(f"UPDATE notifications SET {column} = {value} WHERE id = :id"), {"id": nid}
                )
    # Someone else's context neither sees nor touches the row.
    for tenant in (Tenant(user_id=org.owner.id), Tenant(), Tenant(org_id=uuid.uuid4())):
        async with UnitOfWork(db.sessionmaker, tenant) as uow:
            seen = await uow.session.scalar(text("SELECT count(*) FROM notifications WHERE id = :id"), {"id": nid})
            changed = await uow.session.execute(
                text("UPDATE notifications SET read_at = now() WHERE id = :id RETURNING id"), {"id": nid}
            )
            assert seen == 0 and changed.first() is None, tenant
    async with UnitOfWork(db.sessionmaker, mine) as uow:
        changed = await uow.session.execute(
            text("UPDATE notifications SET read_at = now() WHERE id = :id RETURNING id"), {"id": nid}
        )
        assert changed.first() is not None
        # Their email row is the outbox's, not theirs to read.
        channels = await uow.session.scalars(
            text("SELECT channel FROM notifications WHERE user_id = :u"), {"u": org.member.id}
        )
        assert list(channels) == ["app"]


async def test_preferences_are_each_user_s_own(api: Api, db: Database) -> None:
    a = await api.users.make("a")
    b = await api.users.make("b")
    r = await api.call("PUT", "/me/preferences", b, json={"email": {"export.failed": False}})
    assert r.status_code == 200
    async with UnitOfWork(db.sessionmaker, Tenant(user_id=a.id)) as uow:
        assert await uow.session.scalar(text("SELECT count(*) FROM notification_preferences")) == 0
    with pytest.raises(DBAPIError, match="row-level security"):
        async with UnitOfWork(db.sessionmaker, Tenant(user_id=a.id)) as uow:
            await uow.session.execute(
                text(
                    "INSERT INTO notification_preferences (user_id, type, email) VALUES (:u, 'export.completed', false)"
                ),
                {"u": b.id},
            )


async def test_the_sweeper_function_lists_ids_only_of_due_emails(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org()
    await told(api, db, settings, org)
    (email_id,) = owner.execute(
        "SELECT id FROM notifications WHERE user_id = %s AND channel = 'email'", (org.member.id,)
    ).fetchone()  # type: ignore[misc]

    async def due() -> dict[uuid.UUID, tuple[Any, ...]]:
        async with UnitOfWork(db.sessionmaker) as uow:
            rows = await uow.session.execute(text("SELECT * FROM space_notifications_due_emails(10000)"))
            return {r[0]: tuple(r) for r in rows}

    assert email_id not in await due()  # not overdue: its entry may still be on its way
    owner.execute("UPDATE notifications SET next_attempt_at = now() - interval '2 minutes' WHERE id = %s", (email_id,))
    assert (await due())[email_id] == (email_id, uuid.UUID(org.id), 0)
    owner.execute("UPDATE notifications SET state = 'skipped' WHERE id = %s", (email_id,))
    assert email_id not in await due()


async def test_the_purge_removes_an_org_s_notifications(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api0.org()
    keep = await api0.org("Kept")
    await told(api0, db, settings0, keep)
    await request_deletion(api0, org)
    count = lambda oid: owner.execute("SELECT count(*) FROM notifications WHERE org_id = %s", (oid,)).fetchone()[0]  # type: ignore[index]  # noqa: E731
    assert count(org.id) == 2  # the one owner: in the app and by email
    results = [r for r in await purge_due(settings0, db) if str(r.org_id) == org.id]
    assert results and results[0].counts["notifications"] == 2
    assert count(org.id) == 0 and count(keep.id) == 2
    r = await api0.call("GET", "/me/notifications", org.owner)
    assert r.json() == {"items": [], "next": None, "unread": 0}
