"""SPEC §28: the catalogue says every tenant table is keyed, made unique and joined by org_id, so a later table
can't drift; the rule judges tables it has never heard of (a bad and a good one made here, then rolled back). And
the one foreign key whose ON DELETE had to change its form: a removed assignee."""

from __future__ import annotations

from typing import Any

import psycopg

from space.db import Database
from tests.db.keys import REFERENCE, violations
from tests.exports.fixtures import add_tickets
from tests.helpers import Api, OrgFactory


def test_every_tenant_table_is_keyed_by_org(owner: psycopg.Connection[Any]) -> None:
    assert violations(owner) == []


def test_the_reference_tables_are_the_ones_named(owner: psycopg.Connection[Any]) -> None:
    # The list stays honest: every table it names exists, and none of them carries org_id.
    rows = owner.execute(
        "SELECT c.relname, EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'org_id')"
        " FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relname = ANY (%s)",
        (list(REFERENCE),),
    ).fetchall()
    assert dict(rows) == dict.fromkeys(REFERENCE, False)


def test_an_unnamed_table_is_judged_by_the_rule(owner: psycopg.Connection[Any]) -> None:
    with owner.transaction(force_rollback=True):
        owner.execute(
            """
            CREATE TABLE zz_good (org_id uuid NOT NULL REFERENCES organizations (id), id uuid NOT NULL,
              slug text NOT NULL, PRIMARY KEY (org_id, id), UNIQUE (org_id, slug));
            CREATE TABLE zz_good_child (org_id uuid NOT NULL, id uuid NOT NULL, good_id uuid NOT NULL,
              PRIMARY KEY (org_id, id), FOREIGN KEY (org_id, good_id) REFERENCES zz_good (org_id, id));
            CREATE TABLE zz_bad (id uuid PRIMARY KEY, org_id uuid NOT NULL, slug text UNIQUE,
              n bigint GENERATED ALWAYS AS IDENTITY, UNIQUE (org_id, n));
            CREATE TABLE zz_bad_child (org_id uuid NOT NULL, id uuid NOT NULL, bad_id uuid REFERENCES zz_bad (id),
              PRIMARY KEY (org_id, id));
            CREATE TABLE zz_cross (org_id uuid NOT NULL, id uuid NOT NULL, other uuid REFERENCES organizations (id),
              PRIMARY KEY (org_id, id));
            CREATE TABLE zz_hidden (user_id uuid PRIMARY KEY);
            ALTER TABLE zz_hidden ENABLE ROW LEVEL SECURITY;
            CREATE TABLE zz_keyless (org_id uuid NOT NULL);
            CREATE TABLE zz_user_table (user_id uuid PRIMARY KEY REFERENCES users (id), good_org uuid NOT NULL,
              good_id uuid NOT NULL, FOREIGN KEY (good_org, good_id) REFERENCES zz_good (org_id, id));
            """
        )
        found = [v for v in violations(owner) if v.startswith("zz_")]
    assert found == [
        "zz_bad: primary key zz_bad_pkey lacks org_id",
        "zz_bad: unique index zz_bad_org_id_n_key holds a sequence",
        "zz_bad: unique index zz_bad_slug_key lacks org_id",
        "zz_bad_child: zz_bad_child_bad_id_fkey to zz_bad does not carry org_id on both sides",
        "zz_cross: zz_cross_other_fkey to organizations does not carry org_id on both sides",
        "zz_hidden: primary key zz_hidden_pkey lacks org_id",
        "zz_hidden: row level security but no org_id, and not named a reference table",
        "zz_keyless: no primary key",
        "zz_user_table: zz_user_table_good_org_good_id_fkey, a reference table's foreign key to tenant zz_good",
    ]


async def test_removing_an_assignee_unassigns_only(api: Api, orgs: OrgFactory, db: Database) -> None:
    # The composite foreign key sets only assignee_id to NULL (`SET NULL (assignee_id)`): a plain SET NULL would
    # null the ticket's org_id too, and the member's removal would fail on NOT NULL.
    org = await orgs.make()
    [number] = await add_tickets(db, org.id, org.customer, ["assigned"], assignee_id=org.memberships["member"])
    r = await api.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)
    assert r.status_code == 204, r.text
    r = await api.call("GET", org.path("/tickets"), org.owner)
    assert r.status_code == 200, r.text
    [ticket] = [t for t in r.json()["items"] if t["number"] == number]
    assert (ticket["title"], ticket["assigneeId"]) == ("assigned", None)
