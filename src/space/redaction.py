"""Secrets out of log lines (SPEC §10, §16): download-link tokens in URLs and bearer tokens in headers.

uvicorn's access log writes each request's path with its query string, and a download link's `token=` is
in it; any other line may quote a URL or a header. `redact` masks both kinds wherever they appear in a string;
`RedactTokens` applies it to a record's message and arguments before any handler formats it, and `install`
puts that filter on the loggers that see requests (call it after uvicorn has configured its logging).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

MASK = "[redacted]"

# `token=...` as a query parameter (also URL-encoded `token%3D...`, as it appears inside another URL's query),
# up to the next separator (a link token is base64url and dots: never a `%`); and an Authorization value of the bearer scheme.
_QUERY_TOKEN = re.compile(r"(?i)((?:^|[?&;\s\"']|%3F|%26)token(?:=|%3D))[^&\s\"'#;%]*")
_BEARER = re.compile(r"(?i)(\bbearer\s+)[^\s\"',;]+")

LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn", "space", "litestar")
"""Loggers whose records may quote a request's URL or headers."""


def redact(text: str) -> str:
    """`text` with every `token=` value and bearer credential replaced by [redacted]."""
    lowered = text.lower()
    if "token" not in lowered and "bearer" not in lowered:
        return text  # the common line: no regex work
    return _BEARER.sub(rf"\g<1>{MASK}", _QUERY_TOKEN.sub(rf"\g<1>{MASK}", text))


def _clean(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


class RedactTokens(logging.Filter):
    """Masks tokens in a record's message and its %-arguments (uvicorn's access line passes the path as one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact in place; never drops a record."""
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_clean(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _clean(v) for k, v in record.args.items()}
        return True


_FILTER = RedactTokens()


def install(loggers: Iterable[str] = LOGGERS) -> None:
    """Put the filter on each named logger and its handlers (records propagated from a child logger skip the
    parent's logger filters but not its handlers' filters). Idempotent."""
    for name in loggers:
        logger = logging.getLogger(name)
        targets: list[logging.Filterer] = [logger, *logger.handlers]
        for target in targets:
            if _FILTER not in target.filters:
                target.addFilter(_FILTER)
