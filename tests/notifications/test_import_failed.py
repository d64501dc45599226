"""`import.failed` (SPEC §19, §23): an archive that can't be restored is told to its importer alone, in their own
notifications (no org was made: `orgId` null, with the `importId`), counted, read one by one or all at once; its
email, sent by the real worker to a real SMTP server (aiosmtpd), says the failure in the page's words and holds
nothing of the archive; the preference and SPACE_SMTP_URL are checked again at send time; the sweeper sends one
whose entry was lost; the list pages through an org's notifications and a user's own in one order; and the rows
are their user's alone under RLS."""

from __future__ import annotations

import io
import uuid
import zipfile
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.imports.running import run_import
from space.notifications import service, words
from space.notifications.jobs import sweep_emails_job
from space.notifications.models import NotificationType
from space.notifications.outbox import PERSONAL_EMAILS
from space.notifications.sending import send_personal_email
from space.outbox import OrgBusy, in_flight
from space.queue import open_outbound_queue
from tests.exports.fixtures import add_tickets, in_process_worker, uid, wait_for
from tests.helpers import Api, TestUser, assert_problem
from tests.imports.test_restore import _archive, _post, _rebuild
from tests.notifications.smtp_server import PUBLIC, SmtpServer

SECRET_TITLE = "Payroll of the whole company, do not leak"
SECRET_VALUE = "Payroll-Leak-7"
"""A value the broken line holds, which the import's errorDetail quotes and no email may."""
ITEM_KEYS = {"id", "at", "type", "orgId", "importId", "title", "readAt"}


async def _archive_bytes(api: Api, db: Database, settings: Settings) -> bytes:
    org = await api.org("Payroll Co")
    await add_tickets(db, org.id, org.member, [SECRET_TITLE, "Printer on fire"])
    return await _archive(api, db, settings, org)


def _changed_byte(content: bytes) -> bytes:
    """One byte of the tickets changed, the manifest left as it was (its sha256 no longer holds)."""
    tickets = zipfile.ZipFile(io.BytesIO(content)).read("data/tickets.jsonl")
    return _rebuild(content, {"data/tickets.jsonl": tickets.replace(b"fire", b"fira")}, manifest=False)


def _quoting_line(content: bytes) -> bytes:
    """A ticket line whose status is not one (the manifest made to agree): errorDetail quotes the value."""
    tickets = zipfile.ZipFile(io.BytesIO(content)).read("data/tickets.jsonl")
    bad = tickets.replace(b'"status":"open"', b'"status":"' + SECRET_VALUE.encode() + b'"', 1)
    assert bad != tickets
    return _rebuild(content, {"data/tickets.jsonl": bad})


async def _failed(api: Api, db: Database, settings: Settings, user: TestUser, body: bytes, name: str) -> str:
    """`user`'s import of `body`, run by the worker's own code (no queue: its email is owed, not enqueued)."""
    r = await _post(api, user, body, f"name={name}")
    assert r.status_code == 202, r.text
    import_id = str(r.json()["id"])
    assert await run_import(settings, db, None, uid(import_id), user.id) == "failed"
    return import_id


async def _listed(api: Api, user: TestUser, query: str = "") -> dict[str, Any]:
    r = await api.call("GET", f"/me/notifications{query}", user)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _email_row(owner: psycopg.Connection[Any], import_id: str) -> tuple[Any, ...]:
    """(id, user_id, state, status, attempts, last_error) of the import's one email row."""
    row = owner.execute(
        "SELECT id, user_id, state, status, attempts, last_error FROM personal_notifications"
        " WHERE import_id = %s AND channel = 'email'",
        (import_id,),
    ).fetchone()
    assert row is not None, import_id
    return tuple(row)


async def _settled(owner: psycopg.Connection[Any], import_id: str, states: set[str]) -> tuple[Any, ...]:
    async def check() -> tuple[Any, ...] | None:
        row = _email_row(owner, import_id)
        return row if row[2] in states else None

    result: tuple[Any, ...] = await wait_for(check, f"the email of import {import_id} in {states}")
    return result


# --- in the app ------------------------------------------------------------------------------------------------


async def test_a_broken_archive_tells_its_importer_alone_who_reads_it_one_or_all(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    content = await _archive_bytes(api, db, settings)
    importer = await api.users.make("importer")
    other = await api.users.make("other")
    import_id = await _failed(api, db, settings, importer, _changed_byte(content), "Broken")
    r = await api.call("GET", f"/imports/{import_id}", importer)
    assert r.json()["state"] == "failed" and r.json()["errorCode"] == "archive_invalid", r.text

    page = await _listed(api, importer)
    assert page["unread"] == 1 and page["next"] is None
    (item,) = page["items"]
    assert set(item) == ITEM_KEYS
    assert item["type"] == "import.failed" and item["orgId"] is None and item["importId"] == import_id
    assert item["title"] == "Your archive could not be restored as Broken: the file is not a valid archive"
    assert item["readAt"] is None
    # Written in the transaction that failed it: the importer's own rows (one per channel), no org's.
    rows = owner.execute(
        "SELECT channel, user_id, state, details FROM personal_notifications WHERE import_id = %s ORDER BY channel",
        (import_id,),
    ).fetchall()
    assert rows == [
        ("app", importer.id, "delivered", {"errorCode": "archive_invalid"}),
        ("email", importer.id, "pending", {"errorCode": "archive_invalid"}),
    ]
    assert owner.execute("SELECT count(*) FROM notifications WHERE import_id = %s", (import_id,)).fetchone() == (0,)

    # Another user sees none of it, and can't mark it.
    assert await _listed(api, other) == {"items": [], "next": None, "unread": 0}
    r = await api.call("POST", f"/me/notifications/{item['id']}/read", other)
    assert_problem(r, 404, "not_found")
    r = await api.call("POST", "/me/notifications/read", other)
    assert r.status_code == 204, r.text
    assert (await _listed(api, importer))["items"][0]["readAt"] is None

    # Read one, then (after a second failure) all.
    r = await api.call("POST", f"/me/notifications/{item['id']}/read", importer)
    assert r.status_code == 204, r.text
    page = await _listed(api, importer)
    assert page["unread"] == 0 and page["items"][0]["readAt"] is not None
    again = await _failed(api, db, settings, importer, b"PK\x03\x04 not really", "Again")
    page = await _listed(api, importer)
    assert page["unread"] == 1 and [i["importId"] for i in page["items"]] == [again, import_id]
    r = await api.call("POST", "/me/notifications/read", importer)
    assert r.status_code == 204, r.text
    page = await _listed(api, importer)
    assert page["unread"] == 0 and all(i["readAt"] for i in page["items"])
    assert await _listed(api, other) == {"items": [], "next": None, "unread": 0}


async def test_a_dry_run_tells_nobody_either_way(api: Api, db: Database, settings: Settings) -> None:
    """A dry run writes nothing (SPEC §23), a notification included: its answer is its report, on the page that
    asked; neither a failed check nor a passed one is told."""
    importer = await api.users.make("checker")
    r = await _post(api, importer, b"PK\x03\x04 not really", "name=Checked&dryRun=true")
    assert r.status_code == 202, r.text
    assert await run_import(settings, db, None, uid(r.json()["id"]), importer.id) == "failed"
    assert await _listed(api, importer) == {"items": [], "next": None, "unread": 0}


# --- by email ----------------------------------------------------------------------------------------------------


async def test_the_email_says_what_failed_in_plain_words_and_nothing_of_the_archive(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    content = await _archive_bytes(mapi, db, mail)
    importer = await mapi.users.make("importer")
    async with in_process_worker(mail):
        # Uploaded through the API, restored by the worker, the email enqueued after the failure's commit.
        r = await _post(mapi, importer, _quoting_line(content), "name=Payroll%20again&newIds=true")
        assert r.status_code == 202, r.text
        import_id = str(r.json()["id"])

        async def ended() -> dict[str, Any] | None:
            body: dict[str, Any] = (await mapi.call("GET", f"/imports/{import_id}", importer)).json()
            return body if body["state"] in ("completed", "failed") else None

        done = await wait_for(ended, f"import {import_id} to end")
        row = await _settled(owner, import_id, {"delivered", "failed", "skipped"})
    assert done["state"] == "failed" and done["errorCode"] == "archive_invalid", done
    # The detail quotes the archive (it is the importer's to read in the page); the email must not.
    assert SECRET_VALUE in done["errorDetail"], done["errorDetail"]
    assert row[2:5] == ("delivered", "delivered", 1), row

    (got,) = smtp.recorder.to(importer.email)
    message = got.message
    title = "Your archive could not be restored as Payroll again: the file is not a valid archive"
    assert got.rcpt_tos == [importer.email]
    assert message["Subject"] == title
    assert message["To"] == f"importer <{importer.email}>"
    assert message["Message-ID"] == f"<{row[0]}@localhost>"
    assert message["Auto-Submitted"] == "auto-generated"
    assert message["List-Unsubscribe"] == f"<{PUBLIC}/#/me/preferences>"
    text, html = got.part("plain"), got.part("html")
    link = f"{PUBLIC}/#/imports/{import_id}"
    for part in (text, html):
        assert link in part
        assert "which member of the file, and which line, is wrong" in part
    assert f"{title}.\n\n{words.IMPORT_REASONS['archive_invalid']}\n" in text
    assert "You get this email because of what you did on Space." in text
    assert f'<a href="{link}">' in html
    headers = "\n".join(f"{k}: {v}" for k, v in message.items())
    for never in (SECRET_VALUE, SECRET_TITLE, done["errorDetail"], "data/tickets.jsonl", "line 1", importer.token):
        for where in (got.content.decode(), headers, text, html):
            assert never not in where, never


async def test_with_the_preference_off_it_is_skipped_and_nothing_is_sent(
    mapi: Api, db: Database, mail: Settings, settings: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    importer = await mapi.users.make("quiet")
    r = await mapi.call("PUT", "/me/preferences", importer, json={"email": {"import.failed": False}})
    assert r.status_code == 200 and r.json()["email"]["import.failed"] is False, r.text
    import_id = await _failed(mapi, db, mail, importer, b"PK\x03\x04 not really", "Quiet")
    notification_id, user_id, *_ = _email_row(owner, import_id)
    assert user_id == importer.id
    assert await send_personal_email(mail, db, None, notification_id, user_id) == "skipped"
    assert _email_row(owner, import_id)[2:] == ("skipped", "skipped", 1, "preference_off")
    assert smtp.recorder.tried(importer.email) == []
    # A second job for the row finds nothing to do; the in-app row is there all the same.
    assert await send_personal_email(mail, db, None, notification_id, user_id) == "not_claimed"
    assert [i["importId"] for i in (await _listed(mapi, importer))["items"]] == [import_id]

    # Without SPACE_SMTP_URL nothing is emailed either (the preference on this time).
    plain = await mapi.users.make("plain")
    import_id = await _failed(mapi, db, settings, plain, b"PK\x03\x04 not really", "Plain")
    notification_id, user_id, *_ = _email_row(owner, import_id)
    assert settings.smtp_url is None
    assert await send_personal_email(settings, db, None, notification_id, user_id) == "skipped"
    assert _email_row(owner, import_id)[2:] == ("skipped", "skipped", 1, "email_off")
    assert smtp.recorder.tried(plain.email) == []


async def test_one_persons_emails_hold_at_most_the_outbound_cap(
    mapi: Api, db: Database, mail: Settings, owner: psycopg.Connection[Any]
) -> None:
    """SPEC §25's lane is no one person's either: a user's emails of no org in flight are capped like an org's
    attempts (SPACE_OUTBOUND_ORG_CONCURRENCY), and one user at the cap does not hold up another."""
    importer, other = await mapi.users.make("many"), await mapi.users.make("other")
    rows = []
    for n in range(3):
        import_id = await _failed(mapi, db, mail, importer, b"PK\x03\x04 not really", f"Many {n}")
        rows.append(_email_row(owner, import_id)[0])
    other_row = _email_row(owner, await _failed(mapi, db, mail, other, b"PK\x03\x04 not really", "Other"))[0]

    async def claim(user: TestUser, row_id: uuid.UUID) -> Any:
        async with UnitOfWork(db.sessionmaker, Tenant(user_id=user.id)) as uow:
            return await PERSONAL_EMAILS.claim(uow.session, row_id, user.id, org_concurrency=2)

    assert (await claim(importer, rows[0]))[0] == 1 and (await claim(importer, rows[1]))[0] == 1
    with pytest.raises(OrgBusy):
        await claim(importer, rows[2])
    assert _email_row_by_id(owner, rows[2]) == ("pending", 0)
    async with UnitOfWork(db.sessionmaker, Tenant(user_id=importer.id)) as uow:
        assert await in_flight(uow.session, importer.id, PERSONAL_EMAILS.scope) == 2
    assert (await claim(other, other_row))[0] == 1


def _email_row_by_id(owner: psycopg.Connection[Any], row_id: uuid.UUID) -> tuple[str, int]:
    row = owner.execute("SELECT state, attempts FROM personal_notifications WHERE id = %s", (row_id,)).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


async def test_the_sweeper_sends_a_personal_email_whose_enqueue_was_lost(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    importer = await mapi.users.make("lost")
    # Run with no queue: the email is owed and never enqueued, as when the enqueue after the commit fails.
    import_id = await _failed(mapi, db, mail, importer, b"PK\x03\x04 not really", "Lost")
    notification_id, *_ = _email_row(owner, import_id)
    owner.execute(
        "UPDATE personal_notifications SET next_attempt_at = now() - interval '2 minutes' WHERE id = %s",
        (notification_id,),
    )
    # The sweeper's function names this overdue email row, and neither its in-app row nor a row already sent.
    async with UnitOfWork(db.sessionmaker) as uow:
        due = (await uow.session.execute(text("SELECT * FROM space_notifications_due_personal_emails(1000)"))).all()
    app_row = owner.execute(
        "SELECT id FROM personal_notifications WHERE import_id = %s AND channel = 'app'", (import_id,)
    ).fetchone()
    assert app_row is not None
    due_ids = {row[0] for row in due}
    assert notification_id in due_ids and app_row[0] not in due_ids
    queue = await open_outbound_queue(mail, db, application_name="space-tests-personal-sweeper")
    await queue.connect()
    try:
        ctx = {"db": db, "worker": type("W", (), {"queue": queue})()}
        swept = await sweep_emails_job(ctx)
        assert swept["personal"] >= 1 and swept["enqueued"] >= swept["personal"]
        async with in_process_worker(mail):
            row = await _settled(owner, import_id, {"delivered", "failed"})
    finally:
        await queue.disconnect()
    assert row[2] == "delivered" and len(smtp.recorder.to(importer.email)) == 1


# --- one list of both kinds ----------------------------------------------------------------------------------------


async def test_the_list_pages_through_an_org_s_and_one_s_own_in_one_order(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org()
    person = org.member
    oid, pid = uuid.UUID(org.id), person.id

    async def tell_org(title: str, uow: UnitOfWork) -> None:
        notice = service.Notice(NotificationType.org_deletion_requested, oid, [pid], title)
        assert await service.notify(uow, None, notice) == 1

    async def tell_own(title: str, uow: UnitOfWork) -> None:
        notice = service.Notice(NotificationType.import_failed, None, [pid], title)
        assert await service.notify(uow, None, notice) == 1

    # Interleaved over separate transactions (each its own created_at), then several in one transaction of both
    # contexts: equal created_at across the two tables, ordered by id.
    for i, tell in enumerate([tell_org, tell_own, tell_own, tell_org, tell_own, tell_org]):
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid, user_id=pid)) as uow:
            await tell(f"n{i}", uow)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid, user_id=pid)) as uow:
        for i, tell in enumerate([tell_own, tell_org, tell_own, tell_org]):
            await tell(f"same{i}", uow)
    # And real ones: a failed import of the member's.
    import_id = await _failed(api, db, settings, person, b"PK\x03\x04 not really", "Mine")

    expected = [
        str(row[0])
        for row in owner.execute(
            "SELECT id FROM (SELECT id, created_at FROM notifications WHERE user_id = %(u)s AND channel = 'app'"
            " UNION ALL SELECT id, created_at FROM personal_notifications WHERE user_id = %(u)s AND channel = 'app')"
            " b ORDER BY created_at DESC, id DESC",
            {"u": pid},
        ).fetchall()
    ]
    assert len(expected) == 11
    for limit in (1, 2, 3, 50):
        seen: list[dict[str, Any]] = []
        query = f"?limit={limit}"
        while True:
            page = await _listed(api, person, query)
            assert len(page["items"]) <= limit and page["unread"] == 11
            seen += page["items"]
            if page["next"] is None:
                break
            query = f"?limit={limit}&before={page['next']}"
        assert [i["id"] for i in seen] == expected, limit
    kinds = {(i["orgId"], i["type"]) for i in seen}
    assert kinds == {(org.id, "org.deletion_requested"), (None, "import.failed")}
    assert seen[0]["importId"] == import_id and seen[0]["orgId"] is None
    # A cursor naming one's own row of no org is no one else's.
    first = (await _listed(api, person, "?limit=1"))["next"]
    assert_problem(await api.call("GET", f"/me/notifications?before={first}", org.owner), 400, "invalid_request")
    # An org the member left shows none of its rows; their own stay.
    r = await api.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)
    assert r.status_code == 204, r.text
    page = await _listed(api, person)
    assert {i["type"] for i in page["items"]} == {"import.failed"} and page["unread"] == 6


# --- the rows under RLS, as the app role ---------------------------------------------------------------------------


async def test_the_rows_are_their_user_s_alone_and_only_read_at_is_theirs_to_change(
    api: Api, db: Database, settings: Settings
) -> None:
    importer = await api.users.make("importer")
    other = await api.users.make("other")
    import_id = await _failed(api, db, settings, importer, b"PK\x03\x04 not really", "Mine")
    (item,) = (await _listed(api, importer))["items"]
    nid = uuid.UUID(item["id"])
    mine = Tenant(user_id=importer.id)
    for tenant in (Tenant(user_id=other.id), Tenant(), Tenant(org_id=uuid.uuid4())):
        async with UnitOfWork(db.sessionmaker, tenant) as uow:
            seen = await uow.session.scalar(text("SELECT count(*) FROM personal_notifications"))
            changed = await uow.session.execute(
                text("UPDATE personal_notifications SET read_at = now() WHERE id = :id RETURNING id"), {"id": nid}
            )
            assert seen == 0 and changed.first() is None, tenant
    for column, value in (("title", "'changed'"), ("user_id", f"'{other.id}'"), ("details", "'{}'")):
        with pytest.raises(DBAPIError, match="permission denied"):
            async with UnitOfWork(db.sessionmaker, mine) as uow:
                await uow.session.execute(
                    text(f"UPDATE personal_notifications SET {column} = {value} WHERE id = :id"), {"id": nid}
                )
    # No one writes a row for someone else: not even for the import's own user from another's context.
    with pytest.raises(DBAPIError, match="row-level security"):
        async with UnitOfWork(db.sessionmaker, Tenant(user_id=other.id)) as uow:
            await uow.session.execute(
                text(
                    "INSERT INTO personal_notifications (id, user_id, channel, type, import_id, title, state)"
                    " VALUES (gen_random_uuid(), :u, 'app', 'import.failed', :i, 'forged', 'delivered')"
                ),
                {"u": importer.id, "i": import_id},
            )
    # The sweeper's function lists ids only.
    async with UnitOfWork(db.sessionmaker) as uow:
        result = await uow.session.execute(text("SELECT * FROM space_notifications_due_personal_emails(1000)"))
        assert list(result.keys()) == ["notification_id", "notification_user_id", "notification_attempts"]
