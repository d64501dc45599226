"""Tenancy: the RLS catalogue gate, fail-closed reads, per-transaction tenant context, cross-org 404s."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import make_url, text
from sqlalchemy.exc import DBAPIError

from space.db import APP_ROLE, Database, Tenant, UnitOfWork, app_url
from tests.helpers import Api, Org, app_database

# Tenant tables a request reads; each must show nothing without a tenant context.
TENANT_READS = ["memberships", "projects", "tasks", "tickets", "ticket_counters", "export_jobs", "export_chunks"]
SETTINGS = ["app.org_id", "app.user_id", "app.customer_id"]


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
async def pool1(owner_url: str) -> AsyncIterator[Database]:
    """The app role's engine with one pooled connection, so consecutive transactions share a backend."""
    async with app_database(owner_url, "space-tests-pool1", pool_size=1) as database:
        yield database


def _seed_rows(owner: psycopg.Connection[Any], org: Org) -> dict[str, uuid.UUID]:
    """One row in every tenant table of `org` that the API can't create yet (as the owner, bypassing RLS)."""
    ids = {k: uuid.uuid4() for k in ("project", "task", "ticket", "ticket2", "export")}
    oid = uuid.UUID(org.id)
    owner.execute("INSERT INTO projects (id, org_id, name) VALUES (%s, %s, 'p')", (ids["project"], oid))
    owner.execute(
        "INSERT INTO tasks (id, org_id, project_id, title) VALUES (%s, %s, %s, 't')", (ids["task"], oid, ids["project"])
    )
    for key, number, creator in [("ticket", 1, org.customer.id), ("ticket2", 2, org.customer2.id)]:
        owner.execute(
            "INSERT INTO tickets (id, org_id, number, title, creator_id) VALUES (%s, %s, %s, 'hello', %s)",
            (ids[key], oid, number, creator),
        )
    owner.execute(
        "INSERT INTO export_jobs (id, org_id, creator_id, kind, scope) VALUES (%s, %s, %s, 'snapshot', 'team')",
        (ids["export"], oid, org.owner.id),
    )
    owner.execute(
        "INSERT INTO export_chunks (export_id, execution_id, seq, org_id, data) VALUES (%s, %s, 0, %s, 'x')",
        (ids["export"], uuid.uuid4(), oid),
    )
    return ids


def _owner_counts(owner: psycopg.Connection[Any], org_id: str) -> dict[str, int]:
    counts = {}
    for table in TENANT_READS:
        row = owner.execute(f"SELECT count(*) FROM {table} WHERE org_id = %s", (org_id,)).fetchone()
        assert row is not None
        counts[table] = row[0]
    return counts


# --- 1. catalogue gate --------------------------------------------------------------------------------------


def test_app_role_is_unprivileged_and_owns_nothing(owner: psycopg.Connection[Any]) -> None:
    row = owner.execute(
        "SELECT oid, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = %s",
        (APP_ROLE,),
    ).fetchone()
    assert row is not None, "the app role must exist"
    app_oid, superuser, bypass, createrole, createdb = row
    assert (superuser, bypass, createrole, createdb) == (False, False, False, False)
    # The role and every role it can act as (membership closure): no superuser, no BYPASSRLS, no
    # predefined all-data role, and none owns anything in this database.
    closure = owner.execute(
        "SELECT oid, rolname, rolsuper, rolbypassrls FROM pg_roles WHERE pg_has_role(%s, oid, 'MEMBER')",
        (app_oid,),
    ).fetchall()
    for oid, name, su, by in closure:
        assert not su and not by, name
        assert name not in ("pg_read_all_data", "pg_write_all_data", "pg_execute_server_program"), name
        owned = owner.execute(
            "SELECT c.relkind, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relowner = %s",
            (oid,),
        ).fetchall()
        assert owned == [], (name, owned)
        functions = owner.execute("SELECT proname FROM pg_proc WHERE proowner = %s", (oid,)).fetchall()
        assert functions == [], (name, functions)
        schemas = owner.execute("SELECT nspname FROM pg_namespace WHERE nspowner = %s", (oid,)).fetchall()
        assert schemas == [], (name, schemas)


def test_every_org_table_has_forced_rls_with_a_tenant_policy(owner: psycopg.Connection[Any]) -> None:
    tables = [
        r[0]
        for r in owner.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY 1"
        ).fetchall()
    ]
    # The foundation's tenant tables at least; later migrations may only add to the list.
    assert set(TENANT_READS) <= set(tables), tables
    for table in [*tables, "organizations"]:
        row = owner.execute(
            "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = %s::regclass",
            (f"public.{table}",),
        ).fetchone()
        assert row == (True, True), (table, row)
        policies = owner.execute(
            "SELECT policyname, coalesce(qual, ''), coalesce(with_check, '') FROM pg_policies"
            " WHERE schemaname = 'public' AND tablename = %s",
            (table,),
        ).fetchall()
        assert any("app.org_id" in qual for _, qual, _ in policies), (table, policies)
        # Writes are checked too: a policy for ALL without WITH CHECK uses its USING clause for new rows.
        assert any(
            "app.org_id" in (check or qual)
            for name, qual, check in policies
            if owner.execute(
                "SELECT cmd FROM pg_policies WHERE schemaname = 'public' AND tablename = %s AND policyname = %s",
                (table, name),
            ).fetchone()
            in (("ALL",), ("INSERT",))
        ), (table, policies)


def test_every_policy_the_app_role_gets_is_tenant_scoped(owner: psycopg.Connection[Any]) -> None:
    # Policies are OR-ed: one unscoped permissive policy (say `USING (state = 'deleting')`) granted to the
    # app role would open every org's rows, however tight the others are.
    rows = owner.execute(
        "SELECT tablename, policyname, cmd, coalesce(qual, ''), coalesce(with_check, '') FROM pg_policies"
        " WHERE schemaname = 'public' AND permissive = 'PERMISSIVE'"
        " AND (roles @> ARRAY['public']::name[] OR roles @> ARRAY[%s]::name[])",
        (APP_ROLE,),
    ).fetchall()
    assert rows
    for table, name, cmd, qual, check in rows:
        clauses = [check] if cmd == "INSERT" else [qual] + ([check] if check else [])
        for clause in clauses:
            assert "current_setting('app.org_id'" in clause or "current_setting('app.user_id'" in clause, (
                table,
                name,
                clause,
            )


def test_app_role_cannot_create_objects(owner: psycopg.Connection[Any]) -> None:
    # An app role that could create functions or tables could shadow what a SECURITY DEFINER function
    # resolves through its search_path, or own tables outside RLS.
    row = owner.execute(
        "SELECT has_database_privilege(%s, current_database(), 'CREATE'),"
        " bool_or(has_schema_privilege(%s, n.oid, 'CREATE'))"
        " FROM pg_namespace n WHERE n.nspname NOT LIKE 'pg\\_temp%%' AND n.nspname NOT LIKE 'pg\\_toast%%'",
        (APP_ROLE, APP_ROLE),
    ).fetchone()
    assert row == (False, False), row


def test_ticket_customer_scope_is_a_policy(owner: psycopg.Connection[Any]) -> None:
    quals = owner.execute(
        "SELECT coalesce(qual, '') || ' ' || coalesce(with_check, '') FROM pg_policies"
        " WHERE schemaname = 'public' AND tablename = 'tickets'"
    ).fetchall()
    assert any("app.customer_id" in q for (q,) in quals), quals


def test_no_view_bypasses_rls(owner: psycopg.Connection[Any]) -> None:
    views = owner.execute(
        "SELECT n.nspname, c.relname, c.relkind, coalesce(c.reloptions, '{}') FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind IN ('v', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
    ).fetchall()
    for schema, name, kind, options in views:
        # A materialized view is a copy made by its owner: it can't run as the invoker at all.
        assert kind == "v", f"materialized view {schema}.{name} would bypass RLS"
        opts = {o.split("=", 1)[0]: o.split("=", 1)[1].lower() for o in options}
        assert opts.get("security_invoker") in ("true", "on", "1", "yes"), f"view {schema}.{name}: {options}"


def test_security_definer_functions_pin_their_search_path(owner: psycopg.Connection[Any]) -> None:
    # Privileged cross-org functions run as their owner; an unpinned search_path would let a caller
    # shadow the tables they read with objects of its own.
    rows = owner.execute(
        "SELECT p.proname, coalesce(p.proconfig, '{}') FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE p.prosecdef AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
    ).fetchall()
    for name, config in rows:
        assert any(c.startswith("search_path=") for c in config), (name, config)


# --- 2. fail-closed ----------------------------------------------------------------------------------------


async def test_no_tenant_context_sees_nothing_on_a_fresh_connection(
    api: Api, owner: psycopg.Connection[Any], owner_url: str
) -> None:
    org = await api.org()
    _seed_rows(owner, org)
    hidden = _owner_counts(owner, org.id)
    assert all(n > 0 for n in hidden.values()), hidden
    async with await psycopg.AsyncConnection.connect(_libpq(app_url(owner_url))) as conn:
        cur = await conn.execute("SELECT current_user, current_setting('app.org_id', true)")
        assert await cur.fetchone() in ((APP_ROLE, None), (APP_ROLE, ""))
        for table in [*TENANT_READS, "organizations"]:
            cur = await conn.execute(f"SELECT count(*) FROM {table}")
            assert await cur.fetchone() == (0,), table
        # The same connection with the org's context set does see them: the zero above is RLS, not grants.
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', %s, true)", (org.id,))
            for table, n in hidden.items():
                cur = await conn.execute(f"SELECT count(*) FROM {table}")
                assert await cur.fetchone() == (n,), table


async def test_no_tenant_context_sees_nothing_on_a_reused_pooled_connection(
    api: Api, owner: psycopg.Connection[Any], pool1: Database
) -> None:
    org = await api.org()
    _seed_rows(owner, org)
    hidden = _owner_counts(owner, org.id)
    async with UnitOfWork(pool1.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        pid = await uow.session.scalar(text("SELECT pg_backend_pid()"))
        for table, n in hidden.items():
            assert await uow.session.scalar(text(f"SELECT count(*) FROM {table}")) == n, table
    # A unit of work without a tenant, then a bare connection that never sets one: same backend, no rows.
    async with UnitOfWork(pool1.sessionmaker) as uow:
        assert await uow.session.scalar(text("SELECT pg_backend_pid()")) == pid
        for table in [*TENANT_READS, "organizations"]:
            assert await uow.session.scalar(text(f"SELECT count(*) FROM {table}")) == 0, table
    async with pool1.engine.connect() as conn:
        assert await conn.scalar(text("SELECT pg_backend_pid()")) == pid
        for table in [*TENANT_READS, "organizations"]:
            assert await conn.scalar(text(f"SELECT count(*) FROM {table}")) == 0, table


async def test_writes_into_another_org_are_refused_by_with_check(
    api: Api, owner: psycopg.Connection[Any], db: Database
) -> None:
    a, b = await api.org("A"), await api.org("B")
    ids = _seed_rows(owner, a)
    tenant = Tenant(org_id=uuid.UUID(a.id), user_id=a.owner.id)
    with pytest.raises(DBAPIError, match="row-level security"):
        async with UnitOfWork(db.sessionmaker, tenant) as uow:
            await uow.session.execute(
                text("INSERT INTO projects (id, org_id, name) VALUES (:id, :org, 'x')"),
                {"id": uuid.uuid4(), "org": uuid.UUID(b.id)},
            )
    with pytest.raises(DBAPIError, match="row-level security"):
        async with UnitOfWork(db.sessionmaker, tenant) as uow:
            await uow.session.execute(
                text("UPDATE projects SET org_id = :org WHERE id = :id"), {"id": ids["project"], "org": uuid.UUID(b.id)}
            )
    with pytest.raises(DBAPIError, match="row-level security"):
        async with UnitOfWork(db.sessionmaker, tenant) as uow:
            await uow.session.execute(
                text("INSERT INTO memberships (id, org_id, user_id, role) VALUES (:id, :org, :user, 'owner')"),
                {"id": uuid.uuid4(), "org": uuid.UUID(b.id), "user": a.owner.id},
            )
    # With no tenant at all, even an insert into one's "own" org is refused.
    with pytest.raises(DBAPIError, match="row-level security"):
        async with UnitOfWork(db.sessionmaker) as uow:
            await uow.session.execute(
                text("INSERT INTO projects (id, org_id, name) VALUES (:id, :org, 'x')"),
                {"id": uuid.uuid4(), "org": uuid.UUID(a.id)},
            )
    row = owner.execute("SELECT org_id FROM projects WHERE id = %s", (ids["project"],)).fetchone()
    assert row == (uuid.UUID(a.id),)
    assert owner.execute("SELECT count(*) FROM projects WHERE org_id = %s", (b.id,)).fetchone() == (0,)


async def test_customer_context_sees_only_own_tickets(api: Api, owner: psycopg.Connection[Any], db: Database) -> None:
    org = await api.org()
    ids = _seed_rows(owner, org)
    oid = uuid.UUID(org.id)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid, customer_id=org.customer.id)) as uow:
        seen = (await uow.session.execute(text("SELECT id FROM tickets"))).scalars().all()
        assert seen == [ids["ticket"]]
        # Nor can a customer context write a ticket in someone else's name.
        with pytest.raises(DBAPIError, match="row-level security"):
            async with uow.session.begin_nested():
                await uow.session.execute(
                    text("UPDATE tickets SET creator_id = :other WHERE id = :id"),
                    {"other": org.customer2.id, "id": ids["ticket"]},
                )
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        assert await uow.session.scalar(text("SELECT count(*) FROM tickets")) == 2


# --- 3. no tenant setting survives a transaction -----------------------------------------------------------


async def _settings_on_next_transaction(pool1: Database, pid: int) -> list[str | None]:
    async with pool1.engine.connect() as conn:
        assert await conn.scalar(text("SELECT pg_backend_pid()")) == pid, "expected the same pooled backend"
        row = (await conn.execute(text("SELECT " + ", ".join(f"current_setting('{s}', true)" for s in SETTINGS)))).one()
        return list(row)


async def test_tenant_context_ends_with_a_committed_transaction(api: Api, pool1: Database) -> None:
    org = await api.org()
    tenant = Tenant(org_id=uuid.UUID(org.id), user_id=org.customer.id, customer_id=org.customer.id)
    async with UnitOfWork(pool1.sessionmaker, tenant) as uow:
        pid = await uow.session.scalar(text("SELECT pg_backend_pid()"))
        seen = await uow.session.scalar(text("SELECT current_setting('app.org_id', true)"))
        assert seen == org.id
    assert pid is not None
    for value in await _settings_on_next_transaction(pool1, pid):
        assert value in (None, ""), value


async def test_tenant_context_ends_with_a_rolled_back_transaction(api: Api, pool1: Database) -> None:
    org = await api.org()
    pid: int | None = None

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with UnitOfWork(pool1.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
            await uow.retenant(Tenant(org_id=uuid.UUID(org.id), user_id=org.owner.id, customer_id=org.owner.id))
            pid = await uow.session.scalar(text("SELECT pg_backend_pid()"))
            raise Boom
    assert pid is not None
    for value in await _settings_on_next_transaction(pool1, pid):
        assert value in (None, ""), value


# --- 4. cross-org ------------------------------------------------------------------------------------------


async def test_other_orgs_are_not_found(api: Api) -> None:
    a, b = await api.org("A"), await api.org("B")
    unknown = str(uuid.uuid4())
    bodies = []
    for caller in (a.owner, a.admin, a.member, a.customer):
        for target in (b.id, unknown, "not-a-uuid", b.id.upper(), b.id.replace("-", "")):
            for method, suffix, kw in [
                ("GET", "", {}),
                ("GET", "/members", {}),
                ("POST", "/members", {"json": {"email": caller.email, "role": "owner"}}),
                ("PATCH", f"/members/{b.member.id}", {"json": {"role": "customer"}}),
                ("PATCH", f"/members/{b.owner.id}", {"json": {"role": "member"}}),
                ("DELETE", f"/members/{b.member.id}", {}),
                ("DELETE", f"/members/{b.owner.id}", {}),
            ]:
                r = await api.call(method, f"/orgs/{target}{suffix}", caller, **kw)
                assert r.status_code == 404, (caller.name, target, method, suffix, r.text)
                assert r.headers["content-type"].startswith("application/problem+json")
                bodies.append(r.content)
    # Another org's id, an unknown id and a malformed one are indistinguishable.
    assert len(set(bodies)) == 1, set(bodies)
    assert b.id.encode() not in bodies[0]
    # Nothing changed in B.
    r = await api.call("GET", b.path("/members"), b.owner)
    roles = {m["userId"]: m["role"] for m in r.json()["items"]}
    assert roles == {
        str(b.owner.id): "owner",
        str(b.admin.id): "admin",
        str(b.member.id): "member",
        str(b.customer.id): "customer",
        str(b.customer2.id): "customer",
    }


async def test_org_list_shows_only_own_orgs(api: Api) -> None:
    a, b = await api.org("A"), await api.org("B")
    r = await api.call("GET", "/orgs", a.member)
    assert [o["id"] for o in r.json()["items"]] == [a.id]
    # A user in both orgs sees both, each once.
    r = await api.call("POST", b.path("/members"), b.owner, json={"email": a.member.email, "role": "customer"})
    assert r.status_code == 201, r.text
    r = await api.call("GET", "/orgs", a.member)
    assert sorted(o["id"] for o in r.json()["items"]) == sorted([a.id, b.id])
    # A fresh user belongs nowhere.
    stranger = await api.users.make("stranger")
    r = await api.call("GET", "/orgs", stranger)
    assert r.status_code == 200 and r.json() == {"items": []}
    r = await api.call("GET", a.path(), stranger)
    assert r.status_code == 404
