"""What stops an export run: a failure its owner is told about, a lease that another execution took, or an org
that already runs as many exports as it may."""

from __future__ import annotations


class ExportFailure(Exception):
    """The export can't be produced, for a reason the owner is told (`errorCode`). Not retried."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(detail or code)
        self.code = code
        self.detail = detail
        """Words for the owner (which limit, the setting that raises it), kept as the export's `errorDetail`."""


class LeaseLost(Exception):
    """A fenced write matched no row: another execution owns the export now, or it was cancelled."""


class Deferred(Exception):
    """The org already runs its limit of exports: this one stays queued, its attempt unused, until one ends."""
