"""Engines and URLs: migrations run as the owner, the app and workers as the non-superuser role."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import URL, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

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
_ROLE_CHECK = text(
    """
    SELECT current_user AS role,
      (SELECT array_agg(r.rolname::text ORDER BY r.rolname) FROM pg_roles r
        WHERE r.rolsuper AND pg_has_role(current_user, r.oid, 'MEMBER')) AS superusers,
      (SELECT array_agg(r.rolname::text ORDER BY r.rolname) FROM pg_roles r
        WHERE r.rolbypassrls AND pg_has_role(current_user, r.oid, 'MEMBER')) AS bypassers,
      (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE pg_has_role(current_user, c.relowner, 'MEMBER') AND n.nspname <> 'information_schema'
          AND n.nspname !~ '^pg_(catalog$|toast|temp_)') AS owned,
      (SELECT array_agg(x.name ORDER BY x.name) FROM (
        SELECT format('%I.%I', n.nspname, c.relname) AS name FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE pg_has_role(current_user, c.relowner, 'MEMBER') AND n.nspname <> 'information_schema'
          AND n.nspname !~ '^pg_(catalog$|toast|temp_)'
        ORDER BY 1 LIMIT 3) x) AS examples
    """
)


async def check_app_role(engine: AsyncEngine) -> None:
    """Raise AppRoleError unless the engine's role is no superuser, has no BYPASSRLS and owns no relation."""
    async with engine.connect() as conn:
        row = (await conn.execute(_ROLE_CHECK)).one()
    problems = []
    for roles, what in ((row.superusers, "a superuser"), (row.bypassers, "a role with BYPASSRLS")):
        if roles:
            others = [r for r in roles if r != row.role]
            problems.append(f"is {what}" if row.role in roles else f"can SET ROLE to {what} ({', '.join(others)})")
    if row.role in (row.superusers or ()):
        # A superuser is a member of every role and owns everything; the rest would only repeat that.
        problems = problems[:1]
    elif row.owned:
        more = f" and {row.owned - len(row.examples)} more" if row.owned > len(row.examples) else ""
        problems.append(f"owns {', '.join(row.examples)}{more} (a table's owner can switch its RLS off)")
    if problems:
        raise AppRoleError(
            f"refusing to start: database role {row.role!r} {'; '.join(problems)}. The API and workers must connect"
            f" as a role that is not superuser, has NOBYPASSRLS and owns no table ({APP_ROLE!r} unless"
            " SPACE_APP_DATABASE_URL names another)."
        )


@dataclass
class Database:
    """The application's engine and session factory, connected as the application role."""

    url: str
    application_name: str = "space"
    pool_size: int = 10
    engine: AsyncEngine = field(init=False)
    sessionmaker: async_sessionmaker[AsyncSession] = field(init=False)

    def __post_init__(self) -> None:
        self.engine = create_async_engine(
            self.url,
            pool_size=self.pool_size,
            max_overflow=10,
            pool_pre_ping=True,
            connect_args={"application_name": self.application_name},
        )
        self.sessionmaker = async_sessionmaker(self.engine, expire_on_commit=False, autoflush=False)

    async def dispose(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()
