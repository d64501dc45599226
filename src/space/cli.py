"""The `space` command: up, api, worker, migrate, users, tokens, orgs, demo."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click

from space.config import Settings, SettingsError, data_path, load_settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

T = TypeVar("T")


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


@contextlib.contextmanager
def database(settings: Settings) -> Iterator[tuple[Settings, bool]]:
    """Yield settings whose database_url is set: DATABASE_URL, or the embedded server (started, stopped on exit)."""
    if settings.database_url:
        yield settings, False
        return
    from space.embedded import embedded_server

    with embedded_server(data_path(settings)) as url:
        yield load_settings(database_url=url), True


def _migrate(settings: Settings) -> None:
    from space.db.migrate import upgrade

    assert settings.database_url
    upgrade(settings.database_url)


def _check_app_role(settings: Settings) -> None:
    """Stop with the start-up check's message when the app role could see past RLS (SPEC §14)."""
    from space.db import AppRoleError, check_app_role

    async def go(db: Any) -> None:
        await check_app_role(db.engine)

    try:
        _with_db(settings, go)
    except AppRoleError as exc:
        raise click.ClickException(str(exc)) from None


def _with_db(settings: Settings, fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run `fn(db)` with the app role's engine, then dispose of it."""
    from space.db import Database, app_url

    async def main() -> T:
        assert settings.database_url
        db = Database(app_url(settings.database_url, settings.app_database_url), application_name="space-cli")
        try:
            return await fn(db)
        finally:
            await db.dispose()

    return asyncio.run(main())


def _in_transaction(fn: Callable[[AsyncSession], Awaitable[T]]) -> Callable[[Any], Awaitable[T]]:
    """Adapt `fn(session)` to run in one unit of work (no tenant context) on the db `_with_db` gives."""

    async def run(db: Any) -> T:
        from space.db import UnitOfWork

        async with UnitOfWork(db.sessionmaker) as uow:
            return await fn(uow.session)

    return run


@click.group()
def main() -> None:
    """Space: organization data exports. Settings come from the environment (see README)."""


@main.command()
def up() -> None:
    """Start everything: database (embedded unless DATABASE_URL), migrations, API and an in-process worker."""
    settings = _settings()
    with database(settings) as (s, embedded):
        _migrate(s)
        _check_app_role(s)
        hint = _local_token(s) if embedded else None
        base = f"http://{s.host}:{s.port}"
        click.echo(f"Space is running at {base}  (API docs: {base}/schema/openapi.json)")
        click.echo(f"Try it:  curl -s {base}/health")
        if hint:
            click.echo(f'         curl -s -H "Authorization: Bearer {hint}" {base}/me')
        click.echo("Demo data (two orgs, every role, tickets): .venv/bin/space demo   Stop: Ctrl+C")
        asyncio.run(_serve(s, with_worker=True))


@main.command()
def api() -> None:
    """Serve the API only (production: run workers separately with `space worker`)."""
    settings = _settings()
    with database(settings) as (s, _):
        _check_app_role(s)
        asyncio.run(_serve(s, with_worker=False))


@main.command()
def worker() -> None:
    """Run an export worker until SIGTERM/SIGINT."""
    from space.worker import run_worker

    settings = _settings()
    with database(settings) as (s, _), contextlib.suppress(KeyboardInterrupt):
        _check_app_role(s)
        asyncio.run(run_worker(s))


@main.command()
def migrate() -> None:
    """Apply database migrations (as the DATABASE_URL owner)."""
    settings = _settings()
    with database(settings) as (s, _):
        _migrate(s)
    click.echo("migrated to head")


async def _serve(settings: Settings, *, with_worker: bool) -> None:
    import uvicorn

    from space.app import create_app

    config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, log_level="info")
    server = uvicorn.Server(config)
    # uvicorn handles SIGINT/SIGTERM for a graceful shutdown, then re-raises the signal to the handler that was
    # there before. A no-op one lets us return normally, so the embedded server is stopped by its context.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    tasks: list[asyncio.Task[None]] = []
    if with_worker:
        from space.worker import run_worker

        tasks.append(asyncio.create_task(run_worker(settings), name="space-worker"))
    try:
        await server.serve()
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


def _local_token(settings: Settings) -> str:
    """On the embedded (local) server: a fresh token for the local user, so the printed curl line works."""
    from space.auth import service as auth

    async def go(session: AsyncSession) -> str:
        user = await auth.ensure_user(session, "you@localhost", "You")
        return await auth.issue_token(session, user.id)

    return _with_db(settings, _in_transaction(go))


@main.group()
def users() -> None:
    """Manage users."""


@users.command("add")
@click.argument("email")
@click.option("--name", required=True, help="Display name.")
def users_add(email: str, name: str) -> None:
    """Create a user and print a new token (the last line of output)."""
    from space.auth import service as auth

    async def go(session: AsyncSession) -> tuple[str, str]:
        user = await auth.create_user(session, email, name)
        return str(user.id), await auth.issue_token(session, user.id)

    user_id, token = _run_admin(_in_transaction(go))
    click.echo(f"created user {email.strip().lower()} ({user_id}); token (shown once):")
    click.echo(token)


@main.group()
def tokens() -> None:
    """Manage API tokens."""


@tokens.command("create")
@click.argument("email")
def tokens_create(email: str) -> None:
    """Print a new token for an existing user."""
    from space.auth import service as auth

    async def go(session: AsyncSession) -> str:
        user = await auth.user_by_email(session, email)
        return await auth.issue_token(session, user.id)

    click.echo(_run_admin(_in_transaction(go)))


@tokens.command("revoke")
@click.argument("email")
def tokens_revoke(email: str) -> None:
    """Revoke every token of a user."""
    from space.auth import service as auth

    async def go(session: AsyncSession) -> int:
        user = await auth.user_by_email(session, email)
        return await auth.revoke_tokens(session, user.id)

    click.echo(f"revoked {_run_admin(_in_transaction(go))} token(s) of {email}")


@main.group()
def orgs() -> None:
    """Operate on organizations."""


@orgs.command("purge-due")
def orgs_purge_due() -> None:
    """Purge organizations whose deletion grace period has passed (the cron job, run once)."""
    from space.orgs.jobs import purge_due

    settings = _settings()

    async def go(db: Any) -> Any:
        return await purge_due(settings, db)

    results = _run_admin(go)
    click.echo(f"purged {len(results)} organization(s)")
    for r in results:
        click.echo(f"  {r}")


@main.command()
@click.option(
    "--tickets", "n_tickets", default=300, show_default=True, help="Tickets per org (set-based: 1,000,000 is fine)."
)
@click.option("--tasks", "n_tasks", default=60, show_default=True, help="Tasks per org (set-based: 1,000,000 is fine).")
def demo(n_tickets: int, n_tasks: int) -> None:
    """Fill the database with orgs North and South, a person of every role each, and print their tokens."""
    from rich.progress import Progress

    from space.demo import seed_org

    async def go(db: Any) -> list[Any]:
        with Progress(transient=True) as bar:
            task = bar.add_task("seeding", total=2 * (n_tickets + n_tasks))
            # Both orgs at once: bulk inserts are CPU work for the database, and it has more than one core.
            seeded = await asyncio.gather(
                *(
                    seed_org(db, name, tickets=n_tickets, tasks=n_tasks, progress=lambda n: bar.advance(task, n))
                    for name in ("North", "South")
                )
            )
        return [p for people in seeded for p in people]

    people = _run_admin(go)
    click.echo(f"created orgs North and South with {n_tickets} tickets and {n_tasks} tasks each; tokens:")
    for p in people:
        click.echo(f"  {p.org:<6} {p.role:<10} {p.email:<28} {p.token}")


def _run_admin(fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run an admin coroutine against the configured (or embedded) database, migrated first."""
    settings = _settings()
    with database(settings) as (s, _):
        _migrate(s)
        try:
            return _with_db(s, fn)
        except Exception as exc:
            from space.errors import SpaceError

            if isinstance(exc, SpaceError):
                raise click.ClickException(exc.detail) from None
            raise


if __name__ == "__main__":
    sys.exit(main())
