"""One door for an export's end: the audit rows and outbound events of an ended execution are written by
`space.exports.outcomes` alone, so a new channel (email, a customer's bucket) has one place to hang off."""

from __future__ import annotations

import re
from pathlib import Path

import space

SRC = Path(space.__file__).parent
ENDINGS = re.compile(r"AuditAction\.export_(completed|failed|cancelled)\b|EventType\.export_(completed|failed)\b")


def test_only_the_outcome_seam_writes_an_ended_exports_audit_rows_and_events() -> None:
    writers = sorted(
        str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if ENDINGS.search(path.read_text(encoding="utf-8"))
    )
    assert writers == ["exports/outcomes.py"], writers
