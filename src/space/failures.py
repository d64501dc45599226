"""Failures an operator can fix (an unreachable server, a refused role, a port in use), each told in one line.

`OperatorError` carries that line. `explain` turns the exceptions the libraries raise for such failures into
it; anything it does not recognise is a bug and keeps its traceback. `expect_database` names the setting
behind a connection, so the line says what to change.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import Any

import psycopg
from sqlalchemy import make_url


class OperatorError(Exception):
    """An expected failure, told as one line that says what happened and what to do."""


@contextlib.contextmanager
def expect_database(url: str, setting: str, *, role_hint: str = "") -> Iterator[None]:
    """Turn a failure to connect with `url` into one line naming `setting` (and `role_hint` for a missing role)."""
    try:
        yield
    except OperatorError:
        raise
    except Exception as exc:
        line = connection_failure(exc, url, setting, role_hint=role_hint)
        if line is None:
            raise
        raise OperatorError(line) from exc


def connection_failure(exc: BaseException, url: str | None, setting: str, *, role_hint: str = "") -> str | None:
    """One line for a PostgreSQL connection failure, or None when `exc` is not one."""
    pg = _psycopg_error(exc)
    if pg is None or not _is_connect_failure(pg):
        return None
    where, user, database = _endpoint(pg, url)
    reason = _reason(str(pg))
    low = reason.lower()
    if "does not exist" in low and low.startswith("database"):
        return f"database {database} does not exist on {where}: create it (CREATE DATABASE {database}) or fix {setting}"
    if "does not exist" in low and low.startswith("role"):
        return f"PostgreSQL at {where} refused the connection: role {user} does not exist ({role_hint or 'check ' + setting})"
    if "password" in low or "pg_hba.conf" in low or "authentication" in low or "permission denied" in low:
        return f"PostgreSQL at {where} refused role {user}: {reason} (check the credentials in {setting})"
    if "resolve host" in low or "translate host name" in low:
        return f"cannot find the database host of {where}: {reason} (check {setting})"
    return f"cannot reach the database at {where}: {reason} (is PostgreSQL running there? check {setting})"


def port_in_use(host: str, port: int, exc: OSError) -> OperatorError:
    """The one line for a listening address that can't be bound."""
    if exc.errno == errno.EADDRINUSE:
        return OperatorError(f"{host}:{port} is in use by another program: stop it or choose another SPACE_PORT")
    return OperatorError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (check SPACE_HOST and SPACE_PORT)")


def explain(exc: BaseException) -> str | None:
    """The one line for an expected failure that reached the command unlabelled, or None for a bug."""
    if isinstance(exc, OperatorError):
        return str(exc)
    return connection_failure(exc, None, "DATABASE_URL")


def _psycopg_error(exc: BaseException) -> psycopg.Error | None:
    # SQLAlchemy wraps the driver's error (DBAPIError.orig); other wrappers chain it as a cause or context.
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, psycopg.Error):
            return current
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else (current.__cause__ or current.__context__)
    return None


def _is_connect_failure(exc: psycopg.Error) -> bool:
    # libpq reports failures to connect with no SQLSTATE, as "connection failed: ..." or a name it can't resolve.
    text = str(exc)
    return (
        isinstance(exc, psycopg.OperationalError)
        and exc.sqlstate is None
        and (text.startswith("connection failed") or "resolve host" in text or "translate host name" in text)
    )


def _endpoint(exc: psycopg.Error, url: str | None) -> tuple[str, str, str]:
    """`host:port`, user and database of the failed connection, from libpq's record of it or from the URL."""
    info: dict[str, Any] = {}
    if url:
        u = make_url(url)
        host = u.host or str(u.query.get("host", "") or "")
        info = {"host": host, "port": u.port or 5432, "user": u.username or "", "dbname": u.database or ""}
    conn = exc.pgconn
    if conn is not None:
        for key, value in (("host", conn.host), ("port", conn.port), ("user", conn.user), ("dbname", conn.db)):
            if value:
                info[key] = value.decode(errors="replace")
    host = str(info.get("host") or "localhost")
    where = f"[{host}]:{info.get('port', 5432)}" if ":" in host else f"{host}:{info.get('port', 5432)}"
    return where, str(info.get("user") or "?"), str(info.get("dbname") or "?")


def _reason(text: str) -> str:
    """libpq's reason on the first line, without the 'connection to server at ... failed:' preamble."""
    first = text.strip().splitlines()[0] if text.strip() else text
    reason = first.rsplit("failed: ", 1)[-1].strip()
    reason = reason.removeprefix("FATAL:").strip()
    # libpq capitalises the socket error ("Connection refused"); in the middle of our line it reads better lower.
    return reason[0].lower() + reason[1:] if reason[:1].isupper() and not reason[:2].isupper() else reason
