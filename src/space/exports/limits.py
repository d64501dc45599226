"""What bounds one run of an export kind: its rows, its bytes and the time of its read (SPEC §5, §13, §27).

Each kind's row in the registry says which `Limits` it runs under, read from the settings when the run starts
(and when its queue entry is made, whose timeout follows the read's). One export runs under the SPACE_EXPORT_*
limits, rows counted over the whole result; the complete archive under its own SPACE_ARCHIVE_* limits, far
higher, rows counted per member file, so every org Space holds can take its final archive. The org's result
quota (SPEC §14) applies to every kind, at publish.

A failure's detail says which limit was passed, by how much where that is known, and the setting that raises
it: it is kept on the export (`errorDetail`) and is the detail of the result route's `export_failed`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from space.config import Settings
from space.exports.failures import ExportFailure

QUEUE_SLACK_SECONDS = 30
"""Beyond the read's bound and two leases: what publishing and a last heartbeat may take in the SAQ job."""


@dataclass(frozen=True)
class Limits:
    """The bounds of one run: `rows` (per member file when `per_file`, else over the whole result), `bytes` of
    the whole result, `timeout_seconds` of the read; `settings` names the variables that raise them, in that
    order; `noun` is what the words call the result; `hint` ends a failure's detail (what the requester can do)."""

    rows: int
    bytes: int
    timeout_seconds: float
    settings: tuple[str, str, str]
    noun: str
    per_file: bool = False
    hint: str = ""

    def check_rows(self, counts: Mapping[str, int]) -> None:
        """Raise `too_many_rows` when the counted rows (per file of the result) pass the row limit."""
        if self.per_file:
            for name, rows in counts.items():
                if rows > self.rows:
                    raise self._failure(
                        "too_many_rows",
                        f"The {self.noun}'s {name} would hold {rows} rows, above the {self.noun}'s limit of "
                        f"{self.rows} rows per file ({self.settings[0]}).",
                    )
            return
        total = sum(counts.values())
        if total > self.rows:
            raise self._failure(
                "too_many_rows",
                f"{total} rows exceed the limit of {self.rows} rows per {self.noun} ({self.settings[0]}).",
            )

    def too_large(self) -> ExportFailure:
        """The failure of a result that passed the byte limit."""
        return self._failure(
            "too_large", f"The {self.noun} would exceed its limit of {self.bytes} bytes ({self.settings[1]})."
        )

    def timed_out(self) -> ExportFailure:
        """The failure of a read that took longer than the time bound."""
        return self._failure(
            "timeout",
            f"Reading the data took longer than the {self.timeout_seconds:g} s a {self.noun} may take "
            f"({self.settings[2]}).",
        )

    def queue_timeout(self, lease_seconds: float) -> int:
        """The SAQ job's timeout, in seconds: the read's bound, then two leases and some slack to publish."""
        return math.ceil(self.timeout_seconds) + 2 * math.ceil(lease_seconds) + QUEUE_SLACK_SECONDS

    def _failure(self, code: str, detail: str) -> ExportFailure:
        return ExportFailure(code, f"{detail} {self.hint}" if self.hint else detail)


def one_export(settings: Settings, hint: str = "") -> Limits:
    """The limits of one export (a snapshot, a tickets CSV): SPACE_EXPORT_*, rows over the whole result."""
    return Limits(
        rows=settings.export_row_limit,
        bytes=settings.export_byte_limit,
        timeout_seconds=settings.export_timeout_seconds,
        settings=("SPACE_EXPORT_ROW_LIMIT", "SPACE_EXPORT_BYTE_LIMIT", "SPACE_EXPORT_TIMEOUT_SECONDS"),
        noun="export",
        hint=hint,
    )


def archive(settings: Settings) -> Limits:
    """The complete archive's own limits (SPEC §26, §27): SPACE_ARCHIVE_*, rows per member file."""
    return Limits(
        rows=settings.archive_row_limit,
        bytes=settings.archive_byte_limit,
        timeout_seconds=settings.archive_timeout_seconds,
        settings=("SPACE_ARCHIVE_ROW_LIMIT", "SPACE_ARCHIVE_BYTE_LIMIT", "SPACE_ARCHIVE_TIMEOUT_SECONDS"),
        noun="archive",
        per_file=True,
        # An archive has no filters to narrow: only the operator can let it through.
        hint="The operator of this Space can raise that setting.",
    )
