"""SPEC §28 read from pg_catalog: which tables are per tenant, and every way one breaks distribution by org_id.

A tenant table is any table of `public` with an `org_id` column or with row level security, whoever added it: a
later table is judged by the same rule without being named here. Only the tables that are not per tenant are
named, each with the reason it is not (`REFERENCE`).
"""

from __future__ import annotations

from typing import Any

import psycopg

ROOT = "organizations"
"""The distribution root: its `id` is the org id (distributed by it; tenant tables reference it by org_id)."""

REFERENCE = {
    "users": "people across orgs (a user belongs to many): replicated",
    "api_tokens": "a user's tokens: replicated with users",
    "signing_keys": "the installation's one link-signing key: replicated",
    "installation": "the one row naming this installation: replicated",
    "link_mints": "per user over all their orgs (SPEC §25 link rate): local to the API's database, or replicated",
    "notification_preferences": "a user's email choices over all orgs: replicated with users",
    "alembic_version": "the schema's revision: on every node",
    "imports": "an importer's own uploads (RLS on app.user_id), before any org exists: local to the importing node",
    "import_chunks": "the pieces of an import's upload, kept until its restore ends: local, with imports",
    "personal_notifications": "what a user is told of an event of no org (an import that failed; RLS on"
    " app.user_id): local, with imports",
}
"""Tables that are not per tenant: reference (replicated) or local. The SAQ queue lives in its own schema."""

_TABLES = """
SELECT c.oid, c.relname, c.relrowsecurity, (
  SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = c.oid AND NOT a.attisdropped
    AND a.attname = CASE WHEN c.relname = %s THEN 'id' ELSE 'org_id' END
)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY c.relname
"""
# Every unique index (primary keys and unique constraints are ones too), with its key columns (0: an expression).
_UNIQUE = """
SELECT i.indrelid, ic.relname, i.indisprimary, (i.indkey::int2[])[0:i.indnkeyatts - 1]
FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
WHERE i.indisunique AND i.indrelid = ANY (%s)
"""
_FOREIGN = """
SELECT f.conrelid, f.conname, f.confrelid, f.conkey, f.confkey FROM pg_constraint f
WHERE f.contype = 'f' AND (f.conrelid = ANY (%s) OR f.confrelid = ANY (%s))
"""
# Key columns filled from a sequence: an identity, or a default calling nextval.
_SEQUENCED = """
SELECT a.attrelid, a.attnum FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = ANY (%s) AND a.attnum > 0
  AND (a.attidentity <> '' OR pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%%')
"""


def violations(conn: psycopg.Connection[Any]) -> list[str]:
    """Every breach of SPEC §28 in the database of `conn` (empty: ready to distribute by org_id)."""
    # Each table with the number of its org column: `org_id`, the root's `id`.
    tables = {oid: (name, rls, org) for oid, name, rls, org in conn.execute(_TABLES, (ROOT,)).fetchall()}
    names = {oid: name for oid, (name, _, _) in tables.items()}
    tenant = {oid: org for oid, (name, rls, org) in tables.items() if (org or rls) and name not in REFERENCE}
    oids = list(tables)
    found: list[str] = []
    for oid, org in tenant.items():
        if org is None:
            found.append(f"{names[oid]}: row level security but no org_id, and not named a reference table")
    keyed = {oid for oid, _, primary, _ in conn.execute(_UNIQUE, (oids,)).fetchall() if primary}
    found += [f"{names[oid]}: no primary key" for oid in tenant if oid not in keyed]
    sequenced = set(conn.execute(_SEQUENCED, (oids,)).fetchall())
    for oid, index, primary, columns in conn.execute(_UNIQUE, (oids,)).fetchall():
        if oid not in tenant:
            continue
        what = "primary key" if primary else "unique index"
        if tenant[oid] not in columns:
            found.append(f"{names[oid]}: {what} {index} lacks org_id")
        found += [f"{names[oid]}: {what} {index} holds a sequence" for c in columns if (oid, c) in sequenced]
    for child, name, parent, columns, parent_columns in conn.execute(_FOREIGN, (oids, oids)).fetchall():
        pairs = set(zip(columns, parent_columns, strict=True))
        if child not in tenant:
            if parent in tenant:
                found.append(f"{names[child]}: {name}, a reference table's foreign key to tenant {names[parent]}")
            continue
        if parent not in tenant:
            continue  # to a reference table: replicated on every node
        # Child's org column to the parent's: to the root that is the whole key (org_id -> organizations.id).
        ok = (tenant[child], tenant[parent]) in pairs and (names[parent] != ROOT or len(pairs) == 1)
        if not ok:
            found.append(f"{names[child]}: {name} to {names[parent]} does not carry org_id on both sides")
    return sorted(found)
