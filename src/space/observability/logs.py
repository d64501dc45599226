"""Structured logs (SPEC §16): one formatter for every logger (Space's, uvicorn's, SAQ's, SQLAlchemy's, warnings),
context fields from contextvars, and a redaction step that every line passes.

`SPACE_LOG_FORMAT=json` writes one JSON object per line (`ts`, `level`, `logger`, `event`, and where known
`request_id`, `org_id`, `export_id`, `execution_id`, `attempt`, plus the record's own fields); `text` (the
default) writes the same fields as one readable line. The standard library does the plumbing: a record's
`extra` fields become keys, and `bound`/`bind` put context into every record of the task (and of the tasks it
starts, which copy the context).

Redaction runs last, on every string of every line: bearer tokens, Space tokens (`spc_...`), the value of
every URL query parameter (a link's `token`, a search's `q`), and any field named like a secret, a filter or
row content. What is never logged in the first place is better still: request lines name the path without
its query, statements are logged without parameters (the engines' `hide_parameters`).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import logging
import re
import sys
import traceback
from collections.abc import Iterator
from typing import Any, Literal

import msgspec

_CONTEXT: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("space_log_context", default={})  # noqa: B039
CONTEXT_FIELDS = ("request_id", "org_id", "export_id", "execution_id", "attempt")
"""Context fields, in the order a line shows them."""

REDACTED = "[redacted]"
SECRET_FIELDS = frozenset(
    {"q", "token", "authorization", "password", "secret", "filters", "title", "body", "data", "row", "rows_data"}
)
"""Fields whose values never reach a line, wherever they are nested."""

_STOP = r"""[^\s"'&#,;\\<>)\]}]"""
_PATTERNS = (
    # Authorization: Bearer <t>, bearer <t> anywhere
    (re.compile(r"(?i)\b(bearer)\s+" + _STOP + "+"), r"\1 " + REDACTED),
    # Space's API tokens, wherever they appear
    (re.compile(r"\bspc_[A-Za-z0-9_-]+"), REDACTED),
    # the value of every query parameter: ?token=..., &q=...
    (re.compile(r"([?&][^=&\s?#\"']{1,64})=" + _STOP + "*"), r"\1=" + REDACTED),
    # the password of a URL's user part: smtp://user:<password>@host (SPACE_SMTP_URL), postgresql://...
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@\s/]+@"), r"\1" + REDACTED + "@"),
    # token=..., q=... written as a key and a value elsewhere (a repr, a form body)
    (re.compile(r"""(?i)(\b(?:token|q|authorization)["']?\s*[:=]\s*["']?)""" + _STOP + "+"), r"\1" + REDACTED),
)

# Record attributes that are not a line's own fields (uvicorn's `color_message` repeats the message with ANSI codes).
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName", "color_message"}


@contextlib.contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Add `fields` to every log line written inside the block (and by tasks started in it)."""
    token = _CONTEXT.set({**_CONTEXT.get(), **fields})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def bind(**fields: Any) -> None:
    """Add `fields` to the current context (until the enclosing `bound` block ends)."""
    _CONTEXT.set({**_CONTEXT.get(), **fields})


def context() -> dict[str, Any]:
    """The context fields in force."""
    return dict(_CONTEXT.get())


def redact_text(text: str) -> str:
    """`text` with tokens and query values replaced by [redacted]."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any, key: str = "") -> Any:
    """A log field's value, redacted: secret-named fields wholly, every string by `redact_text`."""
    if key.lower() in SECRET_FIELDS:
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {str(k): redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [redact(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return redact_text(str(value))


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """Everything a line says about `record`, redacted: ts, level, logger, event, context, extras, exc."""
    out: dict[str, Any] = {
        "ts": dt.datetime.fromtimestamp(record.created, dt.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "event": record.getMessage(),
    }
    ctx = getattr(record, "space_context", None) or {}
    for name in CONTEXT_FIELDS:
        if name in ctx:
            out[name] = ctx[name]
    for name, value in record.__dict__.items():
        if name not in _STANDARD and name != "space_context" and not name.startswith("_") and name not in out:
            out[name] = value
    if record.exc_info:
        out["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
    elif record.exc_text:
        out["exc"] = record.exc_text
    if record.stack_info:
        out["stack"] = record.stack_info
    return {k: redact(v, k) if k not in ("ts", "level", "logger") else v for k, v in out.items()}


class ContextFilter(logging.Filter):
    """Attaches the task's context fields to each record, where the formatter finds them."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keep the record; remember the context it was written in."""
        if not hasattr(record, "space_context"):
            record.space_context = _CONTEXT.get()
        return True


_ENCODER = msgspec.json.Encoder(enc_hook=str)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line."""
        return _ENCODER.encode(fields(record)).decode()


class TextFormatter(logging.Formatter):
    """`ts LEVEL logger: event key=value ...`, the traceback below (for people reading `space up`)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as readable text."""
        f = fields(record)
        exc = f.pop("exc", None)
        head = f"{f.pop('ts')} {f.pop('level').upper():<7} {f.pop('logger')}: {f.pop('event')}"
        rest = " ".join(f"{k}={_text_value(v)}" for k, v in f.items())
        line = f"{head}  {rest}" if rest else head
        return f"{line}\n{exc}" if exc else line


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else _ENCODER.encode(value).decode()
    return text if text and not any(c.isspace() for c in text) else msgspec.json.encode(text).decode()


# Third-party loggers whose own handlers would bypass the formatter: they hand their records to the root's.
_ROUTED = ("uvicorn", "uvicorn.error", "uvicorn.access", "saq", "sqlalchemy", "litestar", "py.warnings")


def configure_logging(fmt: Literal["text", "json"], level: int = logging.INFO) -> logging.Handler:
    """Send every logger's records through one handler on stderr, in `fmt`; returns the handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.set_name("space")
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == "space":
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in _ROUTED:
        # Whatever configured these before (uvicorn's own dictConfig, a library's with disable_existing_loggers)
        # is undone: their records reach the one handler, at the root's level.
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        logger.disabled = False
        logger.setLevel(logging.NOTSET)
    # SQLAlchemy's INFO is every statement, Alembic's its plugins and steps: their warnings are what an operator
    # needs (and a failing command stays one line).
    logging.getLogger("sqlalchemy").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # SAQ's INFO is a line per job, the crons' included (several a minute): the exports log their own steps.
    logging.getLogger("saq").setLevel(logging.WARNING)
    logging.captureWarnings(True)
    return handler
