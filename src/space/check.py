"""`space check`: is this deployment set up right? One line per check: ok, or FAIL and what to do.

Each check is a small function of a `Probe` (the settings and the two connections, owner and app role,
opened once) that returns a `Result`, or None when the thing it checks is not configured (it prints no
line then). The check writes nothing: every session it opens is read-only (`default_transaction_read_only`),
and nothing that creates objects (Alembic, SAQ's queue set-up) is called.

`ready_to_serve` is the part of it that `space api`, `space worker` and `space up` run before they start, so
that a deployment they can't serve fails as one line instead of a stream of errors.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from sqlalchemy import make_url, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

from space.config import Settings
from space.db import (
    APP_ROLE,
    QUEUE_ROLE,
    AppRoleError,
    app_role_problems,
    app_url,
    check_app_role,
    queue_conninfo,
    sync_url,
)
from space.db.migrate import scripts
from space.failures import OperatorError, expect_database

MIN_SERVER_VERSION = 150000
"""SPEC §1: PostgreSQL 15 or newer."""
CLOCK_TOLERANCE_SECONDS = 1.0
"""How far this host's clock may be from the database's. Leases and expiry use the database clock; what
this host times (logs, and signed links once they exist) is compared with it."""
CONNECT_TIMEOUT_SECONDS = 10
READ_ONLY = "-c default_transaction_read_only=on"

# The SECURITY DEFINER functions the migrations create: through them the app role reads across orgs (ids and
# counts only) or purges an org's audit trail. They run as their owner, and under FORCE RLS an owner that
# neither is superuser nor has BYPASSRLS sees no row at all: the reconciler and the cleanup would then find
# nothing, silently. Some have a policy of their own. Each maps to a call that proves the app role may run it
# and returns nothing (None: it writes, and the check only reads). The check judges every SECURITY DEFINER
# function the catalogue holds, not only these: this list adds the calls, and a missing one is reported.
MAINTENANCE_FUNCTIONS: dict[str, str | None] = {
    "space_maintenance_due_purges(integer)": "space_maintenance_due_purges(0)",
    "space_exports_reconcile_candidates(integer)": "space_exports_reconcile_candidates(0)",
    "space_exports_expired_results(integer)": "space_exports_expired_results(0)",
    "space_exports_orphan_executions(integer)": "space_exports_orphan_executions(0)",
    "space_webhooks_due_deliveries(integer, interval)": "space_webhooks_due_deliveries(0)",
    "space_notifications_due_emails(integer, interval)": "space_notifications_due_emails(0)",
    "space_notifications_due_personal_emails(integer, interval)": "space_notifications_due_personal_emails(0)",
    "space_exports_queue_stats()": "space_exports_queue_stats()",
    "space_schedules_due(integer)": "space_schedules_due(0)",
    # With no tenant context it answers an empty array without reading a row.
    "space_ticket_search(text, integer)": "space_ticket_search('', 0)",
    # Counts a user that has no exports; the setting it names for its policy is local to the call.
    "space_exports_user_usage(uuid, interval)": (
        "space_exports_user_usage('00000000-0000-0000-0000-000000000000', interval '0')"
    ),
    # The purge of an org's audit trail deletes: the catalogue check (owner, grant, policy) only.
    "space_audit_purge(uuid, integer)": None,
}
OWN_POLICY = {
    "space_maintenance_due_purges(integer)": ("organizations", "maintenance_due_purges"),
    "space_webhooks_due_deliveries(integer, interval)": ("webhook_deliveries", "maintenance_webhook_deliveries"),
    "space_notifications_due_emails(integer, interval)": ("notifications", "maintenance_notifications"),
    "space_notifications_due_personal_emails(integer, interval)": (
        "personal_notifications",
        "maintenance_personal_notifications",
    ),
    "space_audit_purge(uuid, integer)": ("audit_events", "purge_audit"),
    "space_ticket_search(text, integer)": ("tickets", "search_tickets"),
    "space_exports_user_usage(uuid, interval)": ("export_jobs", "limits_user_usage"),
    "space_schedules_due(integer)": ("schedules", "maintenance_schedules"),
}


@dataclass(frozen=True)
class Result:
    """What one check found; `fix` says what to do when it is not ok."""

    ok: bool
    detail: str
    fix: str = ""


def ok(detail: str) -> Result:
    """A passing result."""
    return Result(True, detail)


def fail(detail: str, fix: str) -> Result:
    """A failing result and what to do about it."""
    return Result(False, detail, fix)


def failed(problems: list[tuple[str, str]]) -> Result:
    """One failing result for several (problem, fix) pairs; a fix named twice is said once."""
    fixes = list(dict.fromkeys(f for _, f in problems if f))
    return Result(False, "; ".join(d for d, _ in problems), "; ".join(fixes))


class NotChecked(Exception):
    """A check could not run: a connection it needs failed (that failure has its own line)."""


# --- where to connect, and which setting to name when it fails ----------------------------------------------


@dataclass(frozen=True)
class Target:
    """A URL and the setting an operator changes when connecting with it fails."""

    url: str
    setting: str
    role_hint: str = ""


def owner_target(settings: Settings, *, embedded: bool = False) -> Target:
    """The owner (migrating) role: DATABASE_URL, or the embedded server."""
    assert settings.database_url
    return Target(
        settings.database_url, "the embedded server's folder (SPACE_DATA_DIR)" if embedded else "DATABASE_URL"
    )


def app_target(settings: Settings) -> Target:
    """The application role: SPACE_APP_DATABASE_URL, or derived from DATABASE_URL."""
    assert settings.database_url
    url = app_url(settings.database_url, settings.app_database_url)
    if settings.app_database_url:
        return Target(url, "SPACE_APP_DATABASE_URL")
    derived = "DATABASE_URL, or set SPACE_APP_DATABASE_URL"
    return Target(url, derived, role_hint=f"run `space migrate`: it creates the role {APP_ROLE}")


def queue_target(settings: Settings) -> Target:
    """The queue: SPACE_QUEUE_URL (PostgreSQL or Redis), or the database as the queue role."""
    if settings.queue_url:
        return Target(settings.queue_url, "SPACE_QUEUE_URL")
    assert settings.database_url
    derived = "DATABASE_URL, or set SPACE_QUEUE_URL"
    return Target(
        queue_conninfo(settings.database_url),
        derived,
        role_hint=f"run `space migrate`: it creates the role {QUEUE_ROLE}",
    )


def is_redis(url: str) -> bool:
    """Whether a queue URL selects SAQ's Redis backend."""
    return url.startswith(("redis://", "rediss://", "unix://"))


@contextlib.asynccontextmanager
async def connect(target: Target) -> AsyncIterator[AsyncConnection]:
    """A read-only autocommit connection, its connect failure told as one line naming the setting."""
    engine = create_async_engine(
        sync_url(target.url),
        poolclass=NullPool,
        connect_args={
            "application_name": "space-check",
            "connect_timeout": CONNECT_TIMEOUT_SECONDS,
            "options": READ_ONLY,
        },
    )
    try:
        with expect_database(target.url, target.setting, role_hint=target.role_hint):
            conn = await engine.connect()
        try:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")
        finally:
            await conn.close()
    finally:
        await engine.dispose()


# --- before serving -----------------------------------------------------------------------------------------


async def ready_to_serve(settings: Settings) -> None:
    """Raise OperatorError unless the app role connects, the schema is there and the queue answers."""
    async with connect(app_target(settings)) as app:
        try:
            await check_app_role(app)
        except AppRoleError as exc:
            raise OperatorError(str(exc)) from None
        # The app role can't read alembic_version (it has no grant there) but can see that it exists; a
        # schema that is there but behind is for `space check`, which connects as the owner.
        if not await _schema_present(app):
            raise OperatorError(
                f"the database {app.engine.url.database} is not migrated: run `space migrate` (as the owner)"
            )
        # The installation id names the queue; a database migrated by an older release has none yet.
        if not await app.scalar(text("SELECT to_regclass('public.installation') IS NOT NULL")):
            raise OperatorError(
                f"the database {app.engine.url.database} has no installation id (it names the queue):"
                " run `space migrate` (as the owner)"
            )
    state = await _queue_state(queue_target(settings))
    if not state.usable:
        raise OperatorError(f"{state.problem()}: run `space migrate` (as the owner)")
    store = await _result_store(settings)
    if store is not None and not store.ok:
        raise OperatorError(f"SPACE_RESULT_STORE: {store.detail} ({store.fix})")


async def _schema_present(conn: AsyncConnection) -> bool:
    return bool(await conn.scalar(text("SELECT to_regclass('public.alembic_version') IS NOT NULL")))


# --- the checks ---------------------------------------------------------------------------------------------


@dataclass
class Probe:
    """What the checks share: the settings and the connections that could be opened."""

    settings: Settings
    owner: AsyncConnection | None = None
    app: AsyncConnection | None = None
    owner_error: str = ""
    app_error: str = ""

    def need_owner(self) -> AsyncConnection:
        """The owner connection, or NotChecked."""
        if self.owner is None:
            raise NotChecked("no owner connection")
        return self.owner

    def need_app(self) -> AsyncConnection:
        """The app role's connection, or NotChecked."""
        if self.app is None:
            raise NotChecked("no app connection")
        return self.app

    def any_connection(self) -> AsyncConnection:
        """The owner connection, else the app role's, else NotChecked."""
        if self.owner is None and self.app is None:
            raise NotChecked("no connection")
        return self.owner or self.need_app()


def _described(conn: AsyncConnection) -> str:
    u = conn.engine.url
    host = u.host or str(u.query.get("host", "") or "local socket")
    return f"{u.username}@{host}:{u.port or 5432}/{u.database}"


async def owner_connection(p: Probe) -> Result:
    """The owner (migrating) role connects."""
    if p.owner is None:
        return fail(p.owner_error, "")  # the line says what to check
    return ok(_described(p.owner))


async def app_connection(p: Probe) -> Result:
    """The application role connects."""
    if p.app is None:
        return fail(p.app_error, "")
    return ok(_described(p.app))


async def server_version(p: Probe) -> Result:
    """PostgreSQL is new enough."""
    conn = p.any_connection()
    num = int(await conn.scalar(text("SELECT current_setting('server_version_num')")) or 0)
    version = await conn.scalar(text("SELECT current_setting('server_version')"))
    if num < MIN_SERVER_VERSION:
        return fail(f"PostgreSQL {version}; Space needs 15 or newer", "upgrade PostgreSQL to 15 or newer")
    return ok(f"PostgreSQL {version}")


async def migrations(p: Probe) -> Result:
    """The schema is at this release's head revision."""
    conn = p.need_owner()
    script = scripts()
    heads = set(script.get_heads())
    head = ", ".join(sorted(heads))
    if not await _schema_present(conn):
        return fail(f"not migrated (head is {head})", "run `space migrate`")
    current = set((await conn.scalars(text("SELECT version_num FROM public.alembic_version"))).all())
    at = ", ".join(sorted(current)) or "no revision"
    if current == heads:
        return ok(f"at head {head}")
    known = {rev.revision for rev in script.walk_revisions()}
    if current <= known:
        return fail(f"at {at}, head is {head}", "run `space migrate`")
    return fail(
        f"at {at}, which this release of Space does not know (its head is {head})",
        "run the Space release that migrated this database, or a newer one",
    )


async def app_role(p: Probe) -> Result:
    """The app role is not superuser, has no BYPASSRLS and owns nothing (nor can act as a role that does)."""
    conn = p.need_app()
    role = await conn.scalar(text("SELECT current_user"))
    owner = str(p.owner.engine.url.username) if p.owner is not None else "the owner role"
    problems = await app_role_problems(conn, owner=owner)
    if problems:
        return failed(problems)
    return ok(f"{role}: not superuser, no BYPASSRLS, owns nothing")


async def row_level_security(p: Probe) -> Result:
    """Every table with org_id (and organizations) has RLS enabled, forced, and a tenant policy."""
    conn = p.any_connection()
    problems = await rls_problems(conn)
    if problems:
        return failed(problems)
    count = await conn.scalar(text(f"SELECT count(*) FROM ({_TENANT_TABLES}) t"))
    return ok(f"{count} tenant tables: enabled, forced, each with a tenant policy")


_TENANT_TABLES = (
    "SELECT c.oid, format('%I.%I', n.nspname, c.relname) AS name, c.relrowsecurity, c.relforcerowsecurity,"
    " n.nspname, c.relname"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND (c.relname = 'organizations' OR EXISTS ("
    "  SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped))"
)


async def rls_problems(conn: AsyncConnection) -> list[tuple[str, str]]:
    """Tenant tables whose RLS is off, not forced, or lacks a policy scoping reads and writes to app.org_id."""
    # The same rule as the test suite's catalogue gate: some policy's USING names app.org_id, and some policy
    # for ALL or INSERT checks new rows by it (a policy without WITH CHECK checks them with its USING).
    rows = (
        await conn.execute(
            text(
                "SELECT t.name, t.relrowsecurity, t.relforcerowsecurity,"
                " EXISTS (SELECT 1 FROM pg_policies p WHERE p.schemaname = t.nspname AND p.tablename = t.relname"
                "  AND p.qual LIKE '%app.org_id%'),"
                " EXISTS (SELECT 1 FROM pg_policies p WHERE p.schemaname = t.nspname AND p.tablename = t.relname"
                "  AND p.cmd IN ('ALL', 'INSERT') AND coalesce(p.with_check, p.qual) LIKE '%app.org_id%')"
                f" FROM ({_TENANT_TABLES}) t ORDER BY t.name"
            )
        )
    ).all()
    if not rows:
        return [("no tenant tables", "run `space migrate`")]
    problems: list[tuple[str, str]] = []
    for name, enabled, forced, reads_scoped, writes_scoped in rows:
        if not enabled:
            problems.append((f"{name}: RLS disabled", f"ALTER TABLE {name} ENABLE ROW LEVEL SECURITY"))
        if not forced:
            problems.append((f"{name}: RLS not forced", f"ALTER TABLE {name} FORCE ROW LEVEL SECURITY"))
        if not (reads_scoped and writes_scoped):
            problems.append((f"{name}: no tenant policy", "run `space migrate` (it creates tenant_isolation)"))
    return problems


# Every SECURITY DEFINER function of this database's own schemas (not the system's, not an extension's), and
# the ones the migrations create: what each is, who runs it, who may call it. Named as MAINTENANCE_FUNCTIONS
# spells them (argument types as format_type prints them), with its schema when that is not public.
_PRIVILEGED_FUNCTIONS = """
SELECT CASE WHEN n.nspname = 'public' THEN '' ELSE quote_ident(n.nspname) || '.' END
    || quote_ident(p.proname) || '(' || oidvectortypes(p.proargtypes) || ')', p.prosecdef, r.rolname, r.rolsuper OR r.rolbypassrls,
  has_function_privilege(p.oid, 'EXECUTE'), has_function_privilege('public', p.oid, 'EXECUTE'),
  (SELECT substr(c, length('search_path=') + 1) FROM unnest(p.proconfig) c WHERE c LIKE 'search\\_path=%')
FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE (p.prosecdef AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
    AND NOT EXISTS (SELECT 1 FROM pg_depend d
      WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'))
  OR p.oid = ANY (ARRAY(SELECT to_regprocedure('public.' || s) FROM unnest(CAST(:known AS text[])) s))
ORDER BY 1
"""

_OWN_POLICY_HOLDS = (
    "SELECT EXISTS (SELECT 1 FROM pg_policy pol JOIN pg_roles r ON r.oid = ANY (pol.polroles)"
    " WHERE pol.polrelid = to_regclass(CAST(:policy_table AS text)) AND pol.polname = :policy AND r.rolname = :owner)"
)


async def maintenance_functions(p: Probe) -> Result:
    """Every SECURITY DEFINER function pins its search_path, runs as a role that sees its rows, and the app role
    (only) may call it; the ones the migrations create exist and answer the app role."""
    conn = p.need_app()
    me = str(await conn.scalar(text("SELECT current_user")))
    rows = (await conn.execute(text(_PRIVILEGED_FUNCTIONS), {"known": list(MAINTENANCE_FUNCTIONS)})).all()
    found = {row[0]: row for row in rows}
    problems: list[tuple[str, str]] = [
        (f"{signature} is missing", "run `space migrate`")
        for signature in MAINTENANCE_FUNCTIONS
        if signature not in found
    ]
    owners: set[str] = set()
    for signature, row in found.items():
        owners.add(row[2])
        failing = await _function_problems(conn, row, me)
        call = MAINTENANCE_FUNCTIONS.get(signature)
        if not failing and call is not None:
            # The grant is there; calling it (LIMIT 0 returns nothing) proves the app role really may.
            try:
                await conn.execute(text(f"SELECT count(*) FROM {call}"))
            except DBAPIError as exc:
                failing = [(f"{signature}: {_first_line(exc)}", f"GRANT EXECUTE ON FUNCTION {signature} TO {me}")]
        problems += failing
    if problems:
        return failed(problems)
    return ok(f"{len(found)} functions, run as {', '.join(sorted(owners))}, callable by {me}")


async def _function_problems(conn: AsyncConnection, row: Any, me: str) -> list[tuple[str, str]]:
    signature, definer, owner, bypasses, may_execute, public_may, search_path = row
    problems: list[tuple[str, str]] = []
    if not definer:
        problems.append((f"{signature} is not SECURITY DEFINER", "run `space migrate`"))
    # A definer function resolves unqualified names through the caller's search_path unless it pins its own,
    # and pg_temp not named last is searched first: a caller's temporary table or function would run as the owner.
    path = [part.strip().strip('"') for part in (search_path or "").split(",") if part.strip()]
    if not path or path[-1] != "pg_temp":
        pinned = ", ".join([part for part in path if part != "pg_temp"] or ["pg_catalog"])
        detail = f"search_path is {search_path}, pg_temp not last" if path else "does not pin its search_path"
        problems.append((f"{signature} {detail}", f"ALTER FUNCTION {signature} SET search_path = {pinned}, pg_temp"))
    table, policy = OWN_POLICY.get(signature, (None, None))
    own_policy = table is not None and bool(
        await conn.scalar(
            text(_OWN_POLICY_HOLDS), {"policy_table": f"public.{table}", "policy": policy, "owner": owner}
        )
    )
    if not (bypasses or own_policy):
        problems.append(
            (
                f"{signature} runs as {owner}, which is neither superuser nor BYPASSRLS: under FORCE RLS it sees no rows",
                f"ALTER ROLE {owner} BYPASSRLS (the migrating role must bypass RLS)",
            )
        )
    if not may_execute:
        problems.append((f"{me} may not call {signature}", f"GRANT EXECUTE ON FUNCTION {signature} TO {me}"))
    if public_may:
        problems.append((f"PUBLIC may call {signature}", f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC"))
    return problems


@dataclass(frozen=True)
class QueueState:
    """Who the PostgreSQL queue connects as, the schema SAQ's tables go to, and whether it may use it."""

    user: str
    schema: str
    schema_owner: str | None
    """None: the schema does not exist."""
    usable: bool

    def problem(self) -> str:
        """Why the queue role can't keep its tables in its schema (when it can't)."""
        if self.schema_owner is None:
            return f"the queue role {self.user} has no schema {self.schema} (the first on its search_path)"
        return f"the queue role {self.user} may not use schema {self.schema}, which belongs to {self.schema_owner}"


async def _queue_state(target: Target) -> QueueState:
    """Connect to the queue (PING for Redis); raise OperatorError when it can't be reached."""
    if is_redis(target.url):
        await _ping_redis(target.url)
        return QueueState(user="", schema="", schema_owner="", usable=True)
    with expect_database(target.url, target.setting, role_hint=target.role_hint):
        conninfo = make_url(target.url).set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await psycopg.AsyncConnection.connect(
            conninfo,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            application_name="space-check",
            options=READ_ONLY,
        )
    async with conn:
        # SAQ creates and reads its tables unqualified: they go to the first schema of the role's search_path
        # (current_schema() skips one the role may not use, so that one is looked up by name).
        cur = await conn.execute(
            "SELECT current_user, current_schema(), current_setting('search_path'),"
            " has_schema_privilege(current_schema(), 'USAGE, CREATE')"
        )
        row = await cur.fetchone()
        assert row is not None
        user, schema, search_path, usable = row
        if schema is None:
            first = search_path.split(",")[0].strip().strip('"')
            schema = user if first == "$user" else first
        cur = await conn.execute("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %s", (schema,))
        owner = await cur.fetchone()
    return QueueState(user=user, schema=schema, schema_owner=owner[0] if owner else None, usable=bool(usable))


async def _ping_redis(url: str) -> None:
    from redis.asyncio import Redis
    from redis.exceptions import RedisError

    client = Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_SECONDS)
    try:
        # redis-py types its commands for both clients (sync and async); this one is the async client.
        await cast(Awaitable[bool], client.ping())
    except (RedisError, OSError) as exc:
        u = make_url(url) if "://" in url else None
        where = f"{u.host}:{u.port or 6379}" if u is not None and u.host else url
        raise OperatorError(
            f"cannot reach the queue (Redis) at {where}: {_redis_reason(exc)} (check SPACE_QUEUE_URL)"
        ) from exc
    finally:
        await client.aclose()


def _redis_reason(exc: BaseException) -> str:
    # redis-py says "Error 111 connecting to host:port. Connect call failed (...)": the errno is the news.
    found = re.match(r"Error (-?\d+) ", str(exc))
    if found and int(found.group(1)) > 0:
        return os.strerror(int(found.group(1))).lower()
    return str(exc) or type(exc).__name__


async def queue(p: Probe) -> Result:
    """The queue answers; on PostgreSQL its schema belongs to the queue role."""
    target = queue_target(p.settings)
    try:
        state = await _queue_state(target)
    except OperatorError as exc:
        return fail(str(exc), "")
    if is_redis(target.url):
        return ok("Redis answers PING")
    if state.schema_owner is None:
        return fail(state.problem(), "run `space migrate`")
    if state.schema_owner != state.user:
        return fail(
            f"schema {state.schema} belongs to {state.schema_owner}, not to the queue role {state.user}",
            f"ALTER SCHEMA {state.schema} OWNER TO {state.user}",
        )
    return ok(f"PostgreSQL as {state.user}, schema {state.schema} owned by it")


async def clock(p: Probe) -> Result:
    """This host's clock agrees with the database's."""
    conn = p.any_connection()
    before = time.time()
    db_now = float(await conn.scalar(text("SELECT extract(epoch FROM clock_timestamp())")) or 0)
    after = time.time()
    # The database read its clock somewhere within the round trip: compare with its middle, allow half of it.
    offset, slack = db_now - (before + after) / 2, (after - before) / 2
    side = "behind" if offset > 0 else "ahead of"
    detail = f"this host is {abs(offset):.3f} s {side} the database (+/- {slack:.3f} s)"
    if abs(offset) > CLOCK_TOLERANCE_SECONDS + slack:
        return fail(detail, "synchronise the clocks of this host and the database server (NTP)")
    return ok(detail)


async def result_store(p: Probe) -> Result | None:
    """With S3 results (SPACE_RESULT_STORE=s3://...): the bucket answers and takes a write."""
    return await _result_store(p.settings)


async def _result_store(settings: Settings) -> Result | None:
    if not settings.result_store.startswith("s3://"):
        return None  # the database: checked by the lines above
    from space.exports.storage.s3 import S3Location, StoreUnavailable, check_bucket

    try:
        return ok(await check_bucket(S3Location.parse(settings.result_store)))
    except StoreUnavailable as exc:
        return fail(
            str(exc),
            "check the bucket, AWS_ENDPOINT_URL, AWS_REGION and credentials that may put and delete objects in it",
        )


async def signing_key(p: Probe) -> Result:
    """Download links are signed: by SPACE_SECRET_KEY's keys, or by the one `space migrate` keeps."""
    if p.settings.secret_key:
        keys = len(p.settings.secret_key.split(","))
        return ok(f"SPACE_SECRET_KEY: {keys} key{'s' if keys > 1 else ''} (the first signs)")
    conn = p.need_app()
    try:
        kept = await conn.scalar(text("SELECT count(*) FROM signing_keys"))
    except DBAPIError as exc:
        return fail(_first_line(exc), "run `space migrate`")
    if not kept:
        return fail("no signing key in the database", "run `space migrate`, or set SPACE_SECRET_KEY")
    return ok("kept in the database (shared by every API host)")


async def email(p: Probe) -> Result:
    """Email (SPEC §19): off without SPACE_SMTP_URL; else the server answers (and takes the login, if one is set)."""
    if p.settings.smtp_url is None:
        return ok("off: SPACE_SMTP_URL is unset, so nothing is emailed (notifications stay in the app)")
    from space.notifications.smtp import check_server, parse_smtp_url

    target = parse_smtp_url(p.settings.smtp_url)
    problem = await check_server(target)
    if problem is not None:
        return fail(
            f"{target.shown}: {problem}", "check SPACE_SMTP_URL (host, port, TLS, user and password) and the server"
        )
    return ok(f"{target.shown} answers; mail from {p.settings.mail_from}")


Check = Callable[[Probe], Awaitable[Result | None]]

# In the order they print. A check returns None when its feature is not configured, and then prints no line.
CHECKS: list[tuple[str, Check]] = [
    ("owner connection", owner_connection),
    ("app connection", app_connection),
    ("server version", server_version),
    ("migrations", migrations),
    ("app role", app_role),
    ("row level security", row_level_security),
    ("maintenance functions", maintenance_functions),
    ("queue", queue),
    ("clock", clock),
    ("signing key", signing_key),
    ("result store", result_store),
    ("email", email),
]


async def run_checks(settings: Settings, *, embedded: bool = False) -> list[tuple[str, Result]]:
    """Open the owner and app connections, run every check, return each named result."""
    probe = Probe(settings)
    async with contextlib.AsyncExitStack() as stack:
        try:
            probe.owner = await stack.enter_async_context(connect(owner_target(settings, embedded=embedded)))
        except OperatorError as exc:
            probe.owner_error = str(exc)
        try:
            probe.app = await stack.enter_async_context(connect(app_target(settings)))
        except OperatorError as exc:
            probe.app_error = str(exc)
        results: list[tuple[str, Result]] = []
        for name, check in CHECKS:
            try:
                result = await check(probe)
            except NotChecked as exc:
                result = fail(f"not checked: {exc}", "fix the connection above first")
            if result is not None:
                results.append((name, result))
        return results


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return (str(orig).strip().splitlines() or [type(exc).__name__])[0]
