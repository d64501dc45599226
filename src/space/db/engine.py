"""Engines and URLs: migrations run as the owner, the app and workers as the non-superuser role."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import URL, make_url, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from space.db.reads import OneTripReads, socket_open

APP_ROLE = "space_app"
"""LOGIN, NOSUPERUSER, NOBYPASSRLS, owns nothing: what the API and workers connect as."""
QUEUE_ROLE = "space_queue"
"""Owns the `saq` schema (or, under an ordinary owner, may create in it), where SAQ keeps its own tables."""


def _as_psycopg(url: str | URL) -> URL:
    u = make_url(url)
    return u.set(drivername="postgresql+psycopg")


def sync_url(url: str) -> str:
    """The owner URL in SQLAlchemy form, for Alembic."""
    return _as_psycopg(url).render_as_string(hide_password=False)


# libpq lets URI query parameters override the URI's user and password: `?user=postgres` left in a derived URL
# would connect as the owner whatever the user part says.
_CREDENTIAL_PARAMS = ("user", "password")


def _as_role(url: URL, role: str) -> URL:
    # Built anew: URL.set(password=None) means "keep the password", and the owner's must not travel along.
    return URL.create(
        url.drivername,
        username=role,
        host=url.host,
        port=url.port,
        database=url.database,
        query={k: v for k, v in url.query.items() if k not in _CREDENTIAL_PARAMS},
    )


def app_url(owner_url: str, explicit: str | None = None) -> str:
    """The application role's URL: given explicitly, or the owner's server and database as APP_ROLE."""
    if explicit:
        return _as_psycopg(explicit).render_as_string(hide_password=False)
    return _as_role(_as_psycopg(owner_url), APP_ROLE).render_as_string(hide_password=False)


def queue_conninfo(owner_url: str) -> str:
    """A libpq URL for SAQ's pool: the same server and database, as QUEUE_ROLE."""
    u = _as_role(make_url(owner_url).set(drivername="postgresql"), QUEUE_ROLE)
    return u.render_as_string(hide_password=False)


class AppRoleError(Exception):
    """The role the API or a worker connects as could see past RLS; the message names what is wrong."""


# The role connected, and every role it can become or act as (membership): SET ROLE to a superuser, a
# BYPASSRLS role or a table's owner escapes RLS as surely as being one. Temporary schemas are left out (a
# session's own temporary tables are harmless), and so are the system schemas.
async def app_role_problems(conn: AsyncConnection, *, owner: str = "the owner role") -> list[tuple[str, str]]:
    """What unfits the connected role to serve under RLS, as (problem, fix) pairs; empty when it is fit.

    The role and every role it can act as (membership closure) must be neither superuser nor BYPASSRLS nor
    able to create roles, and own no relation, function or schema in this database (an owner can switch RLS
    off). The same rule as the test suite's catalogue gate (written there independently). Both the start-up
    check and `space check` use it.
    """
    me = str(await conn.scalar(text("SELECT current_user")))
    rows = (
        await conn.execute(
            text(
                "SELECT r.rolname, r.rolsuper, r.rolbypassrls, r.rolcreaterole,"
                " ARRAY(SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c"
                "  JOIN pg_namespace n ON n.oid = c.relnamespace"
                "  WHERE c.relowner = r.oid AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') ORDER BY 1),"
                " ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proowner = r.oid ORDER BY 1),"
                " ARRAY(SELECT quote_ident(nspname) FROM pg_namespace WHERE nspowner = r.oid ORDER BY 1)"
                " FROM pg_roles r WHERE pg_has_role(current_user, r.oid, 'MEMBER')"
                " ORDER BY r.rolname <> current_user, r.rolname"
            )
        )
    ).all()
    problems: list[tuple[str, str]] = []
    for name, superuser, bypass, createrole, relations, functions, schemas in rows:
        who = f"{me}" if name == me else f"{me} can act as {name}, which"
        fix_role = f"ALTER ROLE {name}" if name == me else f"REVOKE {name} FROM {me}; or ALTER ROLE {name}"
        if superuser:
            # A superuser is a member of every role: the closure says nothing more.
            return [
                (
                    f"{who} is a superuser",
                    f"connect the app as {APP_ROLE} (SPACE_APP_DATABASE_URL), or {fix_role} NOSUPERUSER",
                )
            ]
        if bypass:
            problems.append((f"{who} has BYPASSRLS", f"{fix_role} NOBYPASSRLS"))
        if createrole:
            problems.append((f"{who} has CREATEROLE", f"{fix_role} NOCREATEROLE"))
        if name in ("pg_read_all_data", "pg_write_all_data", "pg_execute_server_program"):
            problems.append((f"{me} is a member of {name}", f"REVOKE {name} FROM {me}"))
        owned = [*relations, *(f"function {f}" for f in functions), *(f"schema {s}" for s in schemas)]
        if owned:
            shown = ", ".join(owned[:3]) + (f" and {len(owned) - 3} more" if len(owned) > 3 else "")
            fix = (
                f"ALTER TABLE {relations[0]} OWNER TO {owner} (and each other one)"
                if relations
                else f"REASSIGN OWNED BY {name} TO {owner}"
            )
            problems.append((f"{who} owns {shown}", fix))
    return problems


async def check_app_role(conn: AsyncConnection) -> None:
    """Raise AppRoleError unless the connected role is fit to serve under RLS (SPEC §14): the API and the
    worker call it before serving anything."""
    problems = await app_role_problems(conn)
    if problems:
        role = await conn.scalar(text("SELECT current_user"))
        said = "; ".join(f"{problem} (fix: {fix})" for problem, fix in problems)
        raise AppRoleError(
            f"refusing to start: database role {role!r}: {said}. The API and workers must connect as a role that"
            f" is not superuser, has NOBYPASSRLS and owns no table ({APP_ROLE!r} unless SPACE_APP_DATABASE_URL"
            " names another)."
        )


def _still_open(dbapi_connection: Any) -> bool:
    """Whether a pooled connection may be handed out, as its socket says (`reads.socket_open`), with no round trip.

    SQLAlchemy's own pre-ping sends `SELECT 1` and waits for it: a round trip, and about a third of the API's CPU
    of an authorized read, at every checkout (decision 0099). An unusable connection is replaced by a new one (and
    every older one renewed).
    """
    return socket_open(dbapi_connection.driver_connection)


@dataclass
class Database:
    """The application's engine and session factory, connected as the application role."""

    url: str
    application_name: str = "space"
    pool_size: int = 10
    pool_timeout: float = 30.0
    """Seconds a caller waits for a free pooled connection: SQLAlchemy's TimeoutError, or `reads.TripTimeout` for a
    read of one trip."""
    server_settings: dict[str, str] = field(default_factory=dict)
    """Session settings every connection starts with (libpq `options`), e.g. the API's statement_timeout."""
    engine: AsyncEngine = field(init=False)
    sessionmaker: async_sessionmaker[AsyncSession] = field(init=False)
    reads: OneTripReads = field(init=False)
    """Connections of their own for the reads of one round trip (the authorization, a download's parts)."""

    def __post_init__(self) -> None:
        connect_args: dict[str, str] = {"application_name": self.application_name}
        if self.server_settings:
            connect_args["options"] = " ".join(f"-c {k}={v}" for k, v in self.server_settings.items())
        self.engine = create_async_engine(
            self.url,
            pool_size=self.pool_size,
            max_overflow=10,
            pool_timeout=self.pool_timeout,
            pool_pre_ping=True,
            # An error's text (and so a log line) never carries a statement's parameters: a search's `q`,
            # ticket content, token hashes (SPEC §16).
            hide_parameters=True,
            connect_args=connect_args,
        )
        # The pool's check of a connection it hands out asks the socket, not the server (decision 0099).
        self.engine.dialect.do_ping = _still_open  # type: ignore[method-assign]
        self.sessionmaker = async_sessionmaker(self.engine, expire_on_commit=False, autoflush=False)
        self.reads = OneTripReads(
            make_url(self.url).set(drivername="postgresql").render_as_string(hide_password=False),
            size=self.pool_size,
            timeout=self.pool_timeout,
            **connect_args,
        )

    async def dispose(self) -> None:
        """Close every pooled connection."""
        try:
            await self.reads.close()
        finally:
            await self.engine.dispose()
