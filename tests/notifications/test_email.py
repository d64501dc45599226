"""Email notifications (SPEC §19) sent by the real worker code to a real SMTP server (aiosmtpd on a free local
port): the messages as received (recipients, headers, both parts, the link, and what must never be in them), the
recipient checked again at send time, 4xx and dead servers retried, 5xx final, several workers sending each row
once, and an export that no notification can change."""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
from saq import Job

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.pipeline import run_export
from space.notifications import service
from space.notifications.jobs import sweep_emails_job
from space.notifications.models import NotificationType
from space.notifications.outbox import EMAILS, SEND_EMAIL, retry_schedule
from space.notifications.sending import send_email
from space.queue import open_outbound_queue
from tests.exports.fixtures import (
    add_tickets,
    create_export,
    download,
    in_process_worker,
    runner,
    tuned,
    uid,
    wait_for,
    wait_state,
)
from tests.helpers import Api, Org, TestUser, free_port
from tests.notifications.smtp_server import PUBLIC, Received, SmtpServer

TICKET_TEXT = "Payroll of the whole company, do not leak"
SEARCH = "Payroll"


async def received(smtp: SmtpServer, user: TestUser, n: int = 1) -> list[Received]:
    """The messages the server accepted for `user`, once there are `n`."""

    async def check() -> list[Received] | None:
        got = smtp.recorder.to(user.email)
        return got if len(got) >= n else None

    result: list[Received] = await wait_for(check, f"{n} message(s) to {user.email}")
    return result


def email_row(owner: psycopg.Connection[Any], user: TestUser, type_: str) -> tuple[Any, ...]:
    """(id, org_id, state, status, attempts, last_error) of the user's one email row of `type_`."""
    row = owner.execute(
        "SELECT id, org_id, state, status, attempts, last_error FROM notifications"
        " WHERE user_id = %s AND channel = 'email' AND type = %s",
        (user.id, type_),
    ).fetchone()
    assert row is not None, (user, type_)
    return tuple(row)


async def settled_row(owner: psycopg.Connection[Any], user: TestUser, type_: str, states: set[str]) -> tuple[Any, ...]:
    """The email row once its state is one of `states`."""

    async def check() -> tuple[Any, ...] | None:
        row = email_row(owner, user, type_)
        return row if row[2] in states else None

    result: tuple[Any, ...] = await wait_for(check, f"{user.email}'s {type_} email in {states}")
    return result


async def finished(api: Api, db: Database, settings: Settings, org: Org, user: TestUser, body: dict[str, Any]) -> str:
    """`user`'s export run to its end by the pipeline itself (no queue: its email is owed, not yet enqueued)."""
    export = await create_export(api, org, user, body)
    await run_export(runner(settings, db), uid(export["id"]), uid(org.id))
    return str(export["id"])


# --- what a message says --------------------------------------------------------------------------------------


async def test_the_completed_email_as_received(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    await add_tickets(db, org.id, org.member, [TICKET_TEXT, "another ticket"])
    body = {"kind": "tickets_csv", "filters": {"q": SEARCH}}
    export_id = await finished(mapi, db, mail, org, org.member, body)
    # A link minted before the email goes: its token is nowhere in the email either.
    r = await mapi.call("POST", org.path(f"/exports/{export_id}/links"), org.member)
    assert r.status_code == 201, r.text
    link_token = r.json()["url"].split("token=", 1)[1]
    notification_id, org_id, *_ = email_row(owner, org.member, "export.completed")
    assert await send_email(mail, db, None, notification_id, org_id) == "delivered"

    (got,) = smtp.recorder.to(org.member.email)
    message = got.message
    assert got.rcpt_tos == [org.member.email] and got.mail_from == "space@localhost"
    assert message["To"] == f"member <{org.member.email}>"
    assert message["From"] == "Space <space@localhost>"
    assert message["Subject"] == "Your Tickets (CSV) export in Acme is ready"
    assert message["Auto-Submitted"] == "auto-generated"
    assert message["Message-ID"] == f"<{notification_id}@localhost>"
    assert message["Date"] and message["List-Unsubscribe"] == f"<{PUBLIC}/#/me/preferences>"
    assert message.get_content_type() == "multipart/alternative"
    text, html = got.part("plain"), got.part("html")
    link = f"{PUBLIC}/#/orgs/{org.id}/exports/{export_id}"
    for part in (text, html):
        assert link in part
        assert "Your Tickets (CSV) export in Acme is ready: 1 row," in part
        assert "You can download it until " in part and " UTC." in part
    assert text.startswith("Hello member,\n")
    assert re.search(r"ready: 1 row, \d+ bytes\.", text), text
    assert f'<a href="{link}">' in html
    # Never a download URL, a link or bearer token, the filter, or exported content.
    # Looked for in the bytes and in the decoded parts (quoted-printable may fold a long word across lines).
    headers = "\n".join(f"{k}: {v}" for k, v in message.items())
    for never in (TICKET_TEXT, SEARCH, link_token, org.member.token, "/result", "token", "eyJ", "filters"):
        for where in (got.content.decode(), headers, text, html):
            assert never not in where, never
    # The recipient is the creator alone; the in-app row is there as well.
    for other in (org.owner, org.admin, org.customer):
        assert smtp.recorder.to(other.email) == []
    r = await mapi.call("GET", "/me/notifications", org.member)
    assert [i["exportId"] for i in r.json()["items"]] == [export_id]
    assert email_row(owner, org.member, "export.completed")[2:5] == ("delivered", "delivered", 1)


async def test_the_failed_email_says_why_in_the_page_s_words(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    await add_tickets(db, org.id, org.member, [TICKET_TEXT, "two"])
    async with in_process_worker(tuned(mail, export_row_limit=1)):
        export = await create_export(mapi, org, org.member, {"kind": "tickets_csv", "filters": {"q": "o"}})
        done = await wait_state(mapi, org, org.member, export["id"], {"failed", "completed"})
        await settled_row(owner, org.member, "export.failed", {"delivered", "failed"})
    (got,) = smtp.recorder.to(org.member.email)
    assert done["errorCode"] == "too_many_rows"
    assert got.rcpt_tos == [org.member.email]
    assert got.message["Subject"] == "Your Tickets (CSV) export in Acme failed"
    text = got.part("plain")
    assert (
        "Your Tickets (CSV) export in Acme failed.\n\nToo many rows for one export. Narrow the filters and request it again.\n"
        in text
    )
    assert f"{PUBLIC}/#/orgs/{org.id}/exports/{export['id']}" in text
    assert TICKET_TEXT not in got.content.decode() and "/result" not in got.content.decode()


async def test_every_owner_is_emailed_a_deletion_request(
    mapi: Api, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org("Doomed")
    r = await mapi.call("PATCH", org.path(f"/members/{org.admin.id}"), org.owner, json={"role": "owner"})
    assert r.status_code == 200, r.text
    async with in_process_worker(mail):
        r = await mapi.call(
            "POST", org.path("/deletion"), org.owner, json={"confirm": "Doomed", "skipFinalExport": True}
        )
        assert r.status_code == 202, r.text
        for who in (org.owner, org.admin):
            await settled_row(owner, who, "org.deletion_requested", {"delivered", "failed"})
    got = [smtp.recorder.to(who.email)[0] for who in (org.owner, org.admin)]
    for message in got:
        assert message.message["Subject"] == "Doomed is going to be deleted"
        text = message.part("plain")
        assert "owner asked to delete the organization Doomed." in text
        assert "will be deleted after" in text and f"{PUBLIC}/#/orgs/{org.id}\n" in text
    assert smtp.recorder.to(org.member.email) == []


async def test_a_cancellation_by_an_admin_is_emailed_to_the_creator(
    mapi: Api, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    export = await create_export(mapi, org, org.member, {"kind": "snapshot"})
    r = await mapi.call("DELETE", org.path(f"/exports/{export['id']}"), org.admin)
    assert r.status_code == 204, r.text
    # Enqueued by the API after its commit (not left to the sweeper, which waits a minute for a lost entry).
    async with in_process_worker(mail):
        await settled_row(owner, org.member, "export.cancelled", {"delivered", "failed"})
    (got,) = smtp.recorder.to(org.member.email)
    assert got.message["Subject"] == "Your Snapshot (JSON) export in Acme was cancelled"
    assert "An owner or administrator of the organization cancelled this export." in got.part("plain")
    assert smtp.recorder.to(org.admin.email) == []


# --- the server's answers ----------------------------------------------------------------------------------------


async def test_a_451_once_still_delivers_exactly_once(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    smtp.recorder.answer(org.member.email, "451 4.3.0 Try again later")
    async with in_process_worker(mail):
        export = await create_export(mapi, org, org.member, {"kind": "snapshot"})
        await wait_state(mapi, org, org.member, export["id"], {"completed"})
        row = await settled_row(owner, org.member, "export.completed", {"delivered", "failed"})
    assert row[2:5] == ("delivered", "delivered", 2)
    assert smtp.recorder.tried(org.member.email) == ["451 4.3.0 Try again later", "250 Message accepted for delivery"]
    assert len(smtp.recorder.to(org.member.email)) == 1


async def test_a_550_fails_the_email_and_the_export_stays_completed_and_downloadable(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    smtp.recorder.answer(org.member.email, "550 5.1.1 No such mailbox")
    async with in_process_worker(mail):
        export = await create_export(mapi, org, org.member, {"kind": "snapshot"})
        await wait_state(mapi, org, org.member, export["id"], {"completed"})
        row = await settled_row(owner, org.member, "export.completed", {"delivered", "failed"})
    assert row[2:5] == ("failed", "failed", 1)
    assert row[5] == "550 5.1.1 No such mailbox"
    assert smtp.recorder.to(org.member.email) == []
    r = await mapi.call("GET", org.path(f"/exports/{export['id']}"), org.member)
    assert r.json()["state"] == "completed" and r.json()["errorCode"] is None
    r = await download(mapi, org, org.member, export["id"])
    assert r.status_code == 200 and r.content.startswith(b"{")


async def test_a_server_that_does_not_answer_is_retried(
    mapi: Api, db: Database, mail: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    export_id = await finished(mapi, db, mail, org, org.member, {"kind": "snapshot"})
    nowhere = tuned(mail, smtp_url=f"smtp://127.0.0.1:{free_port()}", mail_retry_seconds=60)
    notification_id, org_id, *_ = email_row(owner, org.member, "export.completed")
    assert await send_email(nowhere, db, None, notification_id, org_id) == "retrying"
    row = owner.execute(
        "SELECT state, status, attempts, last_error, next_attempt_at - clock_timestamp() > interval '55 seconds'"
        " FROM notifications WHERE id = %s",
        (notification_id,),
    ).fetchone()
    assert row is not None and row[:3] == ("pending", "retrying", 1) and row[3] and row[4] is True
    r = await mapi.call("GET", org.path(f"/exports/{export_id}"), org.member)
    assert r.json()["state"] == "completed"


def test_retries_last_more_than_an_hour() -> None:
    # With the default SPACE_MAIL_RETRY_SECONDS (60): attempts 1, 2, 4, ... 64 minutes apart.
    schedule = retry_schedule(Settings().mail_retry_seconds)
    assert len(schedule) == EMAILS.max_attempts - 1
    assert schedule[-1] >= 3600 and schedule[0] == 60


# --- several workers ---------------------------------------------------------------------------------------------


async def test_two_workers_draining_one_outbox_send_each_email_once(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    people = [await mapi.users.make("crowd") for _ in range(8)]
    oid = uuid.UUID(org.id)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        notice = service.Notice(
            type=NotificationType.org_deletion_requested,
            org_id=oid,
            recipients=[p.id for p in people],
            title="Acme is going",
        )
        # Owed with no queue: the test enqueues the entries itself, three per row.
        assert await service.notify(uow, None, notice) == len(people)
    for person in people:
        r = await mapi.call("POST", org.path("/members"), org.owner, json={"email": person.email, "role": "member"})
        assert r.status_code == 201, r.text
    rows = owner.execute(
        "SELECT id FROM notifications WHERE org_id = %s AND channel = 'email' AND title = 'Acme is going'", (org.id,)
    ).fetchall()
    assert len(rows) == len(people)
    queue = await open_outbound_queue(mail, db, application_name="space-tests-emails")
    await queue.connect()
    try:
        for (row_id,) in rows:
            # The entry an owe would enqueue, and two more under other keys (a sweeper's, a duplicate): three
            # jobs for one row, taken by whichever worker is free.
            await queue.enqueue(EMAILS.job(row_id, oid, attempt=1, delay=0.0))
            for copy in ("a", "b"):
                job = EMAILS.job(row_id, oid, attempt=1, delay=0.0)
                await queue.enqueue(Job(function=SEND_EMAIL, kwargs=job.kwargs, key=f"{job.key}:{copy}", retries=1))
        # Two slots each: enough to race, and frugal with the server's connections.
        pair = tuned(mail, worker_concurrency=1, outbound_concurrency=2)
        async with in_process_worker(pair), in_process_worker(pair):
            for person in people:
                await received(smtp, person)
                await settled_row(owner, person, "org.deletion_requested", {"delivered", "failed"})
    finally:
        await queue.disconnect()
    for person in people:
        row = email_row(owner, person, "org.deletion_requested")
        tried = smtp.recorder.tried(person.email)
        assert len(smtp.recorder.to(person.email)) == 1, (person.email, row, tried)
        assert row[2:4] == ("delivered", "delivered"), (row, tried)


async def test_the_sweeper_sends_an_email_whose_enqueue_was_lost(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    await finished(mapi, db, mail, org, org.member, {"kind": "snapshot"})
    notification_id, *_ = email_row(owner, org.member, "export.completed")
    owner.execute(
        "UPDATE notifications SET next_attempt_at = now() - interval '2 minutes' WHERE id = %s", (notification_id,)
    )
    queue = await open_outbound_queue(mail, db, application_name="space-tests-sweeper")
    await queue.connect()
    try:
        ctx = {"db": db, "worker": type("W", (), {"queue": queue})()}
        assert (await sweep_emails_job(ctx))["enqueued"] >= 1
        async with in_process_worker(mail):
            row = await settled_row(owner, org.member, "export.completed", {"delivered", "failed"})
    finally:
        await queue.disconnect()
    assert row[2] == "delivered" and len(smtp.recorder.to(org.member.email)) == 1


# --- the recipient, checked again when it is sent ---------------------------------------------------------------


async def test_a_member_removed_before_the_send_gets_nothing(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    await finished(mapi, db, mail, org, org.member, {"kind": "snapshot"})
    r = await mapi.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)
    assert r.status_code == 204, r.text
    notification_id, org_id, *_ = email_row(owner, org.member, "export.completed")
    assert await send_email(mail, db, None, notification_id, org_id) == "skipped"
    assert email_row(owner, org.member, "export.completed")[2:] == ("skipped", "skipped", 1, "not_member")
    assert smtp.recorder.tried(org.member.email) == []
    # A second job for the row finds nothing to do.
    assert await send_email(mail, db, None, notification_id, org_id) == "not_claimed"


async def test_a_preference_off_sends_nothing_and_keeps_the_in_app_row(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    r = await mapi.call("PUT", "/me/preferences", org.member, json={"email": {"export.completed": False}})
    assert r.status_code == 200, r.text
    async with in_process_worker(mail):
        export = await create_export(mapi, org, org.member, {"kind": "snapshot"})
        await wait_state(mapi, org, org.member, export["id"], {"completed"})
        row = await settled_row(owner, org.member, "export.completed", {"skipped", "delivered", "failed"})
    assert row[2:] == ("skipped", "skipped", 1, "preference_off")
    assert smtp.recorder.tried(org.member.email) == []
    r = await mapi.call("GET", "/me/notifications", org.member)
    assert [(i["type"], i["exportId"]) for i in r.json()["items"]] == [("export.completed", export["id"])]


async def test_preference_turned_off_after_the_event_is_still_honoured(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    org = await mapi.org()
    await finished(mapi, db, mail, org, org.member, {"kind": "snapshot"})
    r = await mapi.call("PUT", "/me/preferences", org.member, json={"email": {"export.completed": False}})
    assert r.status_code == 200, r.text
    notification_id, org_id, *_ = email_row(owner, org.member, "export.completed")
    assert await send_email(mail, db, None, notification_id, org_id) == "skipped"
    assert email_row(owner, org.member, "export.completed")[5] == "preference_off"


async def test_without_smtp_nothing_is_emailed_and_the_app_still_tells(
    api: Api, db: Database, settings: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    assert settings.smtp_url is None
    org = await api.org()
    export_id = await finished(api, db, settings, org, org.member, {"kind": "snapshot"})
    notification_id, org_id, *_ = email_row(owner, org.member, "export.completed")
    assert await send_email(settings, db, None, notification_id, org_id) == "skipped"
    assert email_row(owner, org.member, "export.completed")[2:] == ("skipped", "skipped", 1, "email_off")
    assert smtp.recorder.tried(org.member.email) == []
    r = await api.call("GET", "/me/notifications", org.member)
    assert [i["exportId"] for i in r.json()["items"]] == [export_id]


async def test_an_address_the_email_package_can_not_write_fails_at_once(
    mapi: Api, db: Database, mail: Settings, smtp: SmtpServer, owner: psycopg.Connection[Any]
) -> None:
    from space.auth import service as auth

    org = await mapi.org()
    odd = f"odd,{uuid.uuid4().hex[:6]}@example.test"
    async with UnitOfWork(db.sessionmaker) as uow:
        user = await auth.create_user(uow.session, odd, "Odd")
    r = await mapi.call("POST", org.path("/members"), org.owner, json={"email": odd, "role": "owner"})
    assert r.status_code == 201, r.text
    r = await mapi.call("POST", org.path("/deletion"), org.owner, json={"confirm": "Acme", "skipFinalExport": True})
    assert r.status_code == 202, r.text
    (notification_id,) = owner.execute(
        "SELECT id FROM notifications WHERE user_id = %s AND channel = 'email'", (user.id,)
    ).fetchone()  # type: ignore[misc]
    assert await send_email(mail, db, None, notification_id, uuid.UUID(org.id)) == "failed"
    row = owner.execute(
        "SELECT state, attempts, last_error FROM notifications WHERE id = %s", (notification_id,)
    ).fetchone()
    assert row is not None and row[:2] == ("failed", 1) and row[2].startswith("not sendable")
    assert smtp.recorder.tried(odd) == []
