"""The email of a paused schedule (SPEC §19, §21): it says which schedule, in which org and why, in the page's
words, and leads to the org's settings, never to an export's content."""

from __future__ import annotations

import datetime as dt
import uuid

from space.notifications.messages import Letter, compose, schedule_paused_title
from space.notifications.models import NotificationType


def _letter(reason: str, error_code: str | None) -> Letter:
    return Letter(
        notification_id=uuid.uuid4(),
        type=NotificationType.schedule_paused,
        org_id=uuid.UUID(int=7),
        org_name="Acme",
        export_id=None,
        title=schedule_paused_title("tickets_csv", "Acme", reason),
        details={"kind": "tickets_csv", "reason": reason, "failures": 3, "errorCode": error_code},
        at=dt.datetime(2026, 12, 4, tzinfo=dt.UTC),
        recipient_name="Ana",
        recipient_email="ana@example.test",
    )


def test_a_failing_schedule_email_says_why_and_leads_to_the_settings() -> None:
    message = compose(
        _letter("failing", "too_many_rows"), public_base="http://space.test", mail_from=("Space", "s@x.test")
    )
    text = message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert message["Subject"] == "A schedule of Tickets (CSV) exports in Acme was paused: its runs kept failing"
    assert "Its last 3 runs failed" in text
    assert f"http://space.test/#/orgs/{uuid.UUID(int=7)}/settings" in text


def test_an_access_revoked_pause_names_the_reason() -> None:
    message = compose(
        _letter("access_revoked", "access_revoked"), public_base="http://s.test", mail_from=("S", "s@x.test")
    )
    assert message["Subject"].endswith("its creator is no longer an owner or admin")
