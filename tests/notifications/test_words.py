"""An email tells a failure in the page's words: the Python copy (notifications.words) and the page's words.js
say the same of every kind and every reason, and write sizes and counts alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import space
from space.notifications import words

WORDS_JS = (Path(space.__file__).parent / "web" / "static" / "words.js").read_text(encoding="utf-8")


def _object(name: str) -> dict[str, str]:
    match = re.search(r"(?:const|export const) " + name + r" = \{\n(.*?)\n\};", WORDS_JS, re.S)
    assert match, name
    return dict(re.findall(r'^\s+(\w+): "((?:[^"\\]|\\.)*)",$', match.group(1), re.M))


@pytest.mark.parametrize(
    ("name", "ours"),
    [("KINDS", words.KINDS), ("EXPORT_REASONS", words.EXPORT_REASONS), ("IMPORT_REASONS", words.IMPORT_REASONS)],
)
def test_the_email_says_what_the_page_says(name: str, ours: dict[str, str]) -> None:
    theirs = _object(name)
    assert theirs and theirs == ours


def test_sizes_and_counts_read_like_the_page() -> None:
    assert [words.size(n) for n in (0, 812, 1024, 2458, 5 * 1024 * 1024)] == [
        "0 bytes",
        "812 bytes",
        "1.0 KiB",
        "2.4 KiB",
        "5.0 MiB",
    ]
    assert [words.count(n) for n in (0, 1, 1205)] == ["0 rows", "1 row", "1,205 rows"]
    assert words.reason("nobody_knows") == "The export stopped (nobody_knows)."


def test_names_with_line_breaks_never_make_a_header() -> None:
    import datetime as dt
    import email
    import email.policy
    import uuid

    from space.notifications.messages import Letter, compose
    from space.notifications.models import NotificationType

    letter = Letter(
        notification_id=uuid.uuid4(),
        type=NotificationType.export_failed,
        org_id=uuid.uuid4(),
        org_name="Acme\r\nBcc: victim@example.test",
        export_id=uuid.uuid4(),
        title="Your Snapshot (JSON) export in Acme\r\nBcc: victim@example.test failed",
        details={"kind": "snapshot", "errorCode": "timeout"},
        at=dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC),
        recipient_name="Zoë\nX-Evil: 1",
        recipient_email="zoe@example.test",
    )
    raw = compose(
        letter, public_base="https://space.example.test", mail_from=("Space", "space@example.test")
    ).as_bytes()
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert parsed["Bcc"] is None and parsed["X-Evil"] is None
    assert parsed["Subject"] == "Your Snapshot (JSON) export in Acme Bcc: victim@example.test failed"
    assert parsed["To"].addresses[0].display_name == "Zoë X-Evil: 1"
    assert parsed["Date"] == "Thu, 03 Dec 2026 12:00:00 +0000"
