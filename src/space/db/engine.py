"""Engines and URLs: migrations run as the owner, the app and workers as the non-superuser role."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

APP_ROLE = "space_app"
"""LOGIN, NOSUPERUSER, NOBYPASSRLS, owns nothing: what the API and workers connect as."""
QUEUE_ROLE = "space_queue"
"""Owns only the `saq` schema, where SAQ keeps its own tables."""


def _as_psycopg(url: str | URL) -> URL:
    u = make_url(url)
    return u.set(drivername="postgresql+psycopg")


def sync_url(url: str) -> str:
    """The owner URL in SQLAlchemy form, for Alembic."""
    return _as_psycopg(url).render_as_string(hide_password=False)


def app_url(owner_url: str, explicit: str | None = None) -> str:
    """The application role's URL: given explicitly, or the owner's server and database as APP_ROLE."""
    if explicit:
        return _as_psycopg(explicit).render_as_string(hide_password=False)
    u = _as_psycopg(owner_url).set(username=APP_ROLE, password=None)
    return u.render_as_string(hide_password=False)


def queue_conninfo(owner_url: str) -> str:
    """A libpq URL for SAQ's pool: the same server and database, as QUEUE_ROLE."""
    u = make_url(owner_url).set(drivername="postgresql", username=QUEUE_ROLE, password=None)
    return u.render_as_string(hide_password=False)


@dataclass
class Database:
    """The application's engine and session factory, connected as the application role."""

    url: str
    application_name: str = "space"
    pool_size: int = 10
    server_settings: dict[str, str] = field(default_factory=dict)
    """Session settings every connection starts with (libpq `options`), e.g. the API's statement_timeout."""
    engine: AsyncEngine = field(init=False)
    sessionmaker: async_sessionmaker[AsyncSession] = field(init=False)

    def __post_init__(self) -> None:
        connect_args: dict[str, str] = {"application_name": self.application_name}
        if self.server_settings:
            connect_args["options"] = " ".join(f"-c {k}={v}" for k, v in self.server_settings.items())
        self.engine = create_async_engine(
            self.url,
            pool_size=self.pool_size,
            max_overflow=10,
            pool_pre_ping=True,
            connect_args=connect_args,
        )
        self.sessionmaker = async_sessionmaker(self.engine, expire_on_commit=False, autoflush=False)

    async def dispose(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()
