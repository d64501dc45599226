"""The `space` command: up, api, worker, migrate, check, users, tokens, orgs, demo.

A failure an operator can fix (see `space.failures`) ends the command with one line on stderr and exit
code 1; `--debug` or SPACE_DEBUG=1 shows its traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click

from space.config import Settings, SettingsError, data_path, load_settings
from space.failures import OperatorError, expect_database, explain, port_in_use

if TYPE_CHECKING:
    import uvicorn
    from sqlalchemy.ext.asyncio import AsyncSession

T = TypeVar("T")


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


def _say(settings: Settings, line: str) -> None:
    """A banner line: printed as it is, or under SPACE_LOG_FORMAT=json a log line like every other one."""
    if settings.log_format == "json":
        import logging

        logging.getLogger("space").info(line)
    else:
        click.echo(line)


def _serving_settings() -> Settings:
    """Settings of a command that serves (up, api, worker), with its logs set up in SPACE_LOG_FORMAT."""
    from space.observability.logs import configure_logging

    settings = _settings()
    configure_logging(settings.log_format)
    return settings


@contextlib.contextmanager
def database(settings: Settings) -> Iterator[tuple[Settings, bool]]:
    """Yield settings whose database_url is set: DATABASE_URL, or the embedded server (started, stopped on exit)."""
    if settings.database_url:
        yield settings, False
        return
    from space.embedded import embedded_server

    with embedded_server(data_path(settings)) as url:
        yield load_settings(database_url=url), True


def _migrate(settings: Settings, embedded: bool) -> None:
    from space.check import owner_target
    from space.db.migrate import upgrade

    target = owner_target(settings, embedded=embedded)
    with expect_database(target.url, target.setting):
        upgrade(target.url)


def _ready_to_serve(settings: Settings) -> None:
    """Fail as one line, before anything starts, when the app role, the schema or the queue isn't there."""
    from space.check import ready_to_serve

    asyncio.run(ready_to_serve(settings))


def _with_db(settings: Settings, fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run `fn(db)` with the app role's engine, then dispose of it."""
    from space.check import app_target
    from space.db import Database

    target = app_target(settings)

    async def main() -> T:
        db = Database(target.url, application_name="space-cli")
        try:
            return await fn(db)
        finally:
            await db.dispose()

    with expect_database(target.url, target.setting, role_hint=target.role_hint):
        return asyncio.run(main())


def _in_transaction(fn: Callable[[AsyncSession], Awaitable[T]]) -> Callable[[Any], Awaitable[T]]:
    """Adapt `fn(session)` to run in one unit of work (no tenant context) on the db `_with_db` gives."""

    async def run(db: Any) -> T:
        from space.db import UnitOfWork

        async with UnitOfWork(db.sessionmaker) as uow:
            return await fn(uow.session)

    return run


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.params.get("debug")) or os.environ.get("SPACE_DEBUG", "").strip().lower() in ("1", "true")


class _Space(click.Group):
    """The `space` group: an expected failure ends as one line on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; turn an expected failure into a ClickException (one line) unless debugging."""
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except Exception as exc:
            line = explain(exc)
            if line is None or _debug(ctx):
                raise
            raise click.ClickException(line) from None


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import version

    from space.db.migrate import scripts

    head = ", ".join(scripts().get_heads())
    click.echo(f"space {version('space')} (database schema {head})")
    ctx.exit()


@click.group(cls=_Space)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print the version and the schema revision it migrates to.",
)
@click.option("--debug", is_flag=True, help="Show the traceback of a failure (also SPACE_DEBUG=1).")
def main(debug: bool) -> None:
    """Space: organization data exports. Settings come from the environment (see README)."""


@main.command()
def up() -> None:
    """Start everything: database (embedded unless DATABASE_URL), migrations, API and an in-process worker."""
    settings = _serving_settings()
    # The port first: if it is taken, nothing else has been started.
    with _listen(settings) as sock, database(settings) as (s, embedded):
        _migrate(s, embedded)
        _ready_to_serve(s)
        hint = _local_token(s) if embedded else None

        def banner() -> None:
            base = _base_url(s, sock)
            _say(s, f"Space is running at {base}  (API docs: {base}/schema/openapi.json)")
            _say(s, f"Try it:  curl -s {base}/health")
            if hint:
                _say(s, f'         curl -s -H "Authorization: Bearer {hint}" {base}/me')
                _say(s, f"Export center: open {base}/ and sign in with the token above")
            _say(s, "Demo data (two orgs, every role, tickets): .venv/bin/space demo   Stop: Ctrl+C")

        _run(_serve(s, sock, with_worker=True, on_ready=banner))


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run a serving process's main coroutine on uvloop, the event loop uvicorn's standard install brings: every
    request's awaits (its database round trips included) go through the loop, which asyncio runs in Python and
    uvloop in C (docs/decisions 0104). Where uvloop is not installed, on asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a platform without uvloop's wheels
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


@main.command()
def api() -> None:
    """Serve the API only (production: run workers separately with `space worker`)."""
    settings = _serving_settings()
    with _listen(settings) as sock, database(settings) as (s, _):
        _ready_to_serve(s)

        def ready() -> None:
            _say(s, f"Space API listening at {_base_url(s, sock)}")

        _run(_serve(s, sock, with_worker=False, on_ready=ready))


@main.command()
def worker() -> None:
    """Run an export worker until SIGTERM/SIGINT."""
    from space.worker import run_worker

    settings = _serving_settings()
    with database(settings) as (s, _), contextlib.suppress(KeyboardInterrupt):
        _ready_to_serve(s)
        # Its own metrics endpoint: under `space up` the API's /metrics reports the worker's too.
        _run(run_worker(s, serve_metrics=True))


@main.command()
def migrate() -> None:
    """Apply database migrations (as the DATABASE_URL owner)."""
    settings = _settings()
    with database(settings) as (s, embedded):
        _migrate(s, embedded)
    click.echo("migrated to head")


@main.command()
def check() -> None:
    """Report whether this deployment is set up right, one line per check; exit 0 only if all are ok.

    Connects as the owner (DATABASE_URL) and as the app role, and writes nothing.
    """
    from space.check import run_checks

    settings = _settings()
    if not settings.database_url and not (data_path(settings) / "pgdata").is_dir():
        raise OperatorError(
            f"nothing to check: DATABASE_URL is unset and there is no embedded server in {data_path(settings)}"
        )
    with database(settings) as (s, embedded):
        results = asyncio.run(run_checks(s, embedded=embedded))
    failed = 0
    for name, result in results:
        status = click.style("ok  ", fg="green") if result.ok else click.style("FAIL", fg="red", bold=True)
        line = f"{status}  {name}: {result.detail}"
        if not result.ok:
            failed += 1
            line += f" -> {result.fix}" if result.fix else ""
        click.echo(line)
    click.echo(f"{len(results)} checks: " + (f"{failed} failed" if failed else "all ok"))
    if failed:
        sys.exit(1)


def _listen(settings: Settings) -> socket.socket:
    """The API's listening socket, bound now: a port in use fails before anything starts, and in one line."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        sock = socket.create_server((settings.host, settings.port), family=family, backlog=2048)
    except OSError as exc:
        raise port_in_use(settings.host, settings.port, exc) from None
    # Accepted connections inherit TCP_NODELAY from the listener. asyncio sets it itself only on sockets whose
    # proto is IPPROTO_TCP, and create_server's is 0: without it, a response's second small write (the body
    # after the headers) waits for the client's delayed ACK, 40 ms per request on a kept-alive connection.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _base_url(settings: Settings, sock: socket.socket) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{sock.getsockname()[1]}"


def server_config(settings: Settings, log_level: str = "info") -> uvicorn.Config:
    """uvicorn's configuration of the API."""
    import uvicorn

    from space.app import create_app

    # uvicorn would otherwise rewrite the peer from X-Forwarded-For for any request from 127.0.0.1, so a local
    # process could name any address in the audit trail; SPACE_TRUSTED_PROXIES alone decides (space.audit).
    # Its loggers keep the process's formatter (log_config=None), and the app writes the request lines itself
    # (space.observability.requests): uvicorn's access line would quote the query, a link's token in it.
    return uvicorn.Config(
        create_app(settings), log_level=log_level, proxy_headers=False, log_config=None, access_log=False
    )


async def _serve(settings: Settings, sock: socket.socket, *, with_worker: bool, on_ready: Callable[[], None]) -> None:
    """Serve the API on `sock` (and a worker beside it) until a signal; call `on_ready` once both are up.

    If either fails, the other is stopped and the failure raised; the caller's contexts then stop the rest.
    """
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, which tells when it listens (after the app's start-up), so the banner is true."""

        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            self.listening = asyncio.Event()

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            try:
                await super().startup(sockets)
            except SystemExit:
                # uvicorn exits the process when the app's start-up fails, having logged why.
                raise OperatorError("the API did not start: its start-up failed (the log above says why)") from None
            if self.started:
                self.listening.set()

    server = Server(server_config(settings))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(*_: object) -> None:
        # While serving, uvicorn owns SIGINT/SIGTERM; it hands them back here when it is done, so the process
        # returns normally and the embedded server is stopped by its context. Before that, a signal stops the start.
        server.should_exit = True
        if not loop.is_closed():
            loop.call_soon_threadsafe(stopping.set)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    tasks: list[asyncio.Task[None]] = []
    worker: asyncio.Task[None] | None = None
    serving: asyncio.Task[None] | None = None
    worker_quit = False
    try:
        up = True
        if with_worker:
            from space.worker import run_worker

            started = asyncio.Event()
            worker = asyncio.create_task(run_worker(settings, started=started), name="space-worker")
            tasks.append(worker)
            # The worker first: its queue connect creates SAQ's tables on a fresh database, and SAQ lets another
            # connect running meanwhile (the API's) go on before they exist.
            up = await _until(started, tasks, stopping)
        if up:
            serving = asyncio.create_task(server.serve(sockets=[sock]), name="space-api")
            tasks.append(serving)
            if await _until(server.listening, tasks, stopping):
                on_ready()
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Whatever ended first (a signal stopped the server, or something failed), the rest stops too.
        worker_quit = worker is not None and worker.done()
        server.should_exit = True
        if worker is not None:
            worker.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and (exc := t.exception()) is not None:
            raise exc
    if worker_quit and not stopping.is_set():
        raise OperatorError("the worker stopped, so the API was stopped too (its log says why)")


async def _until(event: asyncio.Event, watched: list[asyncio.Task[None]], stopping: asyncio.Event) -> bool:
    """Wait until `event` is set (True), or until a watched task ends or a signal asks to stop (False)."""
    waiters = [asyncio.create_task(event.wait()), asyncio.create_task(stopping.wait())]
    try:
        await asyncio.wait([*waiters, *watched], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
    return event.is_set() and not stopping.is_set()


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
    """Make orgs North and South (once: a second run keeps them), a person of every role each; print ids and tokens.

    Every value is the last field of its line, found by the first two: `awk '$1=="North" && $2=="org" {print $NF}'`
    gives North's id, `awk '$1=="North" && $2=="owner" {print $NF}'` its owner's token."""
    from rich.progress import Progress

    from space.demo import DemoOrg, demo_org

    async def go(db: Any) -> list[DemoOrg]:
        with Progress(transient=True) as bar:
            task = bar.add_task("seeding", total=2 * (n_tickets + n_tasks))
            # Both orgs at once: bulk inserts are CPU work for the database, and it has more than one core.
            return list(
                await asyncio.gather(
                    *(
                        demo_org(db, name, tickets=n_tickets, tasks=n_tasks, progress=lambda n: bar.advance(task, n))
                        for name in ("North", "South")
                    )
                )
            )

    orgs = _run_admin(go)
    made = [o.name for o in orgs if o.created]
    kept = [o.name for o in orgs if not o.created]
    if made:
        click.echo(f"created {' and '.join(made)} with {n_tickets} tickets and {n_tasks} tasks each")
    if kept:
        click.echo(f"kept {' and '.join(kept)} from an earlier `space demo` (its data as it is now)")
    click.echo("orgs:")
    for o in orgs:
        click.echo(f"  {o.name:<6} {'org':<10} {o.id}")
    click.echo("tokens (new ones each run; earlier ones still work):")
    for o in orgs:
        for p in o.people:
            click.echo(f"  {p.org:<6} {p.role:<10} {p.email:<28} {p.token}")


def _run_admin(fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run an admin coroutine against the configured (or embedded) database, migrated first."""
    settings = _settings()
    with database(settings) as (s, embedded):
        _migrate(s, embedded)
        try:
            return _with_db(s, fn)
        except Exception as exc:
            from space.errors import SpaceError

            if isinstance(exc, SpaceError):
                raise click.ClickException(exc.detail) from None
            raise


if __name__ == "__main__":
    sys.exit(main())
