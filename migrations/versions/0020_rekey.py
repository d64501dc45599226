"""rekey (SPEC §28): every tenant table keyed, made unique and joined by `(org_id, ...)`, ready to distribute.

An engine that distributes tables by organization (Citus' multi-tenant model) keeps one org's rows on one node,
and can only enforce a key or a foreign key that carries the distribution column. So:

- each tenant table's primary key becomes `(org_id, id)` (`export_chunks`: `(org_id, export_id, execution_id,
  seq)`); `ticket_counters` and `notifications` (0018) already lead with `org_id`;
- its unique constraints carry `org_id` (`webhook_deliveries`: `(org_id, endpoint_id, event_id)`); the audit
  trail's `seq` loses its UNIQUE: it is an installation-wide identity, and it stays only as the order of one
  org's trail (its index `(org_id, seq DESC)`), never as part of a row's identity (the cursor is the row's id);
- foreign keys between tenant tables carry `org_id` on both sides (a task's project, a ticket's assignee, a
  chunk's export, a delivery's and an attempt's endpoint and delivery), so a row can only point into its own
  org. A ticket whose assignee's membership goes still loses only `assignee_id` (`SET NULL (assignee_id)`).

No value changes: ids stay what the API shows, only the constraints are rebuilt (each index is built once, under
the migration's lock). Two indexes become prefixes of the new keys and go: `projects_org_idx (org_id, id)` (the
primary key now) and `webhook_deliveries_org_idx (org_id, endpoint_id)` (the new unique's prefix).

The downgrade puts the single-column keys back; it fails, and changes nothing, if two orgs came to hold the same
id meanwhile (only `(org_id, id)` is unique now, as on a distributed engine).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# Foreign keys between tenant tables: (table, constraint, columns, parent, parent columns, on delete).
OLD_FKS = (
    ("tasks", "tasks_project_id_fkey", "project_id", "projects", "id", ""),
    ("tickets", "tickets_assignee_id_fkey", "assignee_id", "memberships", "id", "ON DELETE SET NULL"),
    ("export_chunks", "export_chunks_export_id_fkey", "export_id", "export_jobs", "id", ""),
    ("webhook_deliveries", "webhook_deliveries_endpoint_id_fkey", "endpoint_id", "webhook_endpoints", "id", "ON DELETE CASCADE"),
    ("webhook_attempts", "webhook_attempts_endpoint_id_fkey", "endpoint_id", "webhook_endpoints", "id", "ON DELETE CASCADE"),
    ("webhook_attempts", "webhook_attempts_delivery_id_fkey", "delivery_id", "webhook_deliveries", "id", "ON DELETE CASCADE"),
)  # fmt: skip
NEW_FKS = tuple(
    (table, name, f"org_id, {col}", parent, f"org_id, {pcol}", on_delete.replace("SET NULL", f"SET NULL ({col})"))
    for table, name, col, parent, pcol, on_delete in OLD_FKS
)

# Primary keys: (table, old columns, new columns). Parents before children (a new foreign key needs its key).
KEYS = (
    ("memberships", "id", "org_id, id"),
    ("projects", "id", "org_id, id"),
    ("tasks", "id", "org_id, id"),
    ("tickets", "id", "org_id, id"),
    ("export_jobs", "id", "org_id, id"),
    ("export_chunks", "export_id, execution_id, seq", "org_id, export_id, execution_id, seq"),
    ("audit_events", "id", "org_id, id"),
    ("webhook_endpoints", "id", "org_id, id"),
    ("webhook_deliveries", "id", "org_id, id"),
    ("webhook_attempts", "id", "org_id, id"),
)


def _fks(fks: tuple[tuple[str, str, str, str, str, str], ...]) -> str:
    return "".join(
        f"ALTER TABLE {t} ADD CONSTRAINT {name} FOREIGN KEY ({cols}) REFERENCES {parent} ({pcols}) {on_delete};\n"
        for t, name, cols, parent, pcols, on_delete in fks
    )


def _drop_fks() -> str:
    return "".join(f"ALTER TABLE {t} DROP CONSTRAINT {name};\n" for t, name, *_ in OLD_FKS)


def _keys(old: bool) -> str:
    return "".join(
        f"ALTER TABLE {t} DROP CONSTRAINT {t}_pkey, ADD CONSTRAINT {t}_pkey PRIMARY KEY ({o if old else n});\n"
        for t, o, n in KEYS
    )


UPGRADE = f"""
{_drop_fks()}
{_keys(old=False)}
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_endpoint_id_event_id_key,
  ADD CONSTRAINT webhook_deliveries_org_id_endpoint_id_event_id_key UNIQUE (org_id, endpoint_id, event_id);
ALTER TABLE audit_events DROP CONSTRAINT audit_events_seq_key;
COMMENT ON COLUMN audit_events.seq IS
  'The order of one org''s trail (index (org_id, seq DESC)); not part of a row''s identity, never in a cursor.';
DROP INDEX projects_org_idx;
DROP INDEX webhook_deliveries_org_idx;
{_fks(NEW_FKS)}
"""

DOWNGRADE = f"""
{"".join(f"ALTER TABLE {t} DROP CONSTRAINT {name};" for t, name, *_ in NEW_FKS)}
CREATE INDEX webhook_deliveries_org_idx ON webhook_deliveries (org_id, endpoint_id);
CREATE INDEX projects_org_idx ON projects (org_id, id);
COMMENT ON COLUMN audit_events.seq IS NULL;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_seq_key UNIQUE (seq);
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_org_id_endpoint_id_event_id_key,
  ADD CONSTRAINT webhook_deliveries_endpoint_id_event_id_key UNIQUE (endpoint_id, event_id);
{_keys(old=True)}
{_fks(OLD_FKS)}
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
