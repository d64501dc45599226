"""perf: export text computed on write, a covering index for the snapshot, lz4 for result chunks.

Guarding (a regular expression) and timestamp formatting were most of the CSV export's cost on the single
database backend that reads the rows. They are pure functions of the row, so they move into STORED
generated columns, which PostgreSQL keeps right on every INSERT and UPDATE (no trigger, no code path can
forget them) and fills for existing rows when the column is added (a one-off table rewrite):

- `tickets.csv_head`: `"number","title","status","priority",` (title guarded, every field quoted);
- `tickets.csv_tail`: `,"createdAt","updatedAt"` and CRLF (RFC 3339 UTC with microseconds);
- `users.csv_name`: the guarded, quoted display name (the assignee cell, looked up per export).

Both ticket columns use `,`; `space_csv_head_sep`/`space_csv_tail_sep` derive the `;` forms by position
(the layout is fixed). The snapshot's task read gets a covering index, and result chunks lz4 compression
when the server has it (each explained where it is made, below).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# to_char is STABLE only because some patterns (TMMonth, ...) follow the locale; this picture has none, and
# the zone is fixed to UTC, so the result depends on the value alone: IMMUTABLE is true, and generated
# columns require it. PL/pgSQL, not SQL: an IMMUTABLE SQL function calling a STABLE one is not inlined and
# then costs far more per call.
FUNCTIONS = r"""
CREATE FUNCTION space_csv_ts(v timestamptz) RETURNS text
  LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$ BEGIN RETURN to_char(timezone('UTC', v), 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'); END $$;
COMMENT ON FUNCTION space_csv_ts(timestamptz) IS 'RFC 3339 UTC with microseconds, independent of settings.';

CREATE FUNCTION space_csv_head(num integer, title text, status text, priority text) RETURNS text
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$ BEGIN
  RETURN space_csv_quote(num::text) || ',' || space_csv_quote(space_csv_guard(title)) || ','
    || space_csv_quote(status) || ',' || space_csv_quote(priority) || ',';
END $$;
COMMENT ON FUNCTION space_csv_head(integer, text, text, text) IS
  'The CSV cells before the assignee, with a trailing comma (SPEC 7: guarded, quoted).';

CREATE FUNCTION space_csv_tail(created timestamptz, updated timestamptz) RETURNS text
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$ BEGIN
  RETURN ',' || space_csv_quote(space_csv_ts(created)) || ',' || space_csv_quote(space_csv_ts(updated)) || E'\r\n';
END $$;
COMMENT ON FUNCTION space_csv_tail(timestamptz, timestamptz) IS
  'The CSV cells after the assignee, with a leading comma and the CRLF record end.';

-- The `;` forms of the stored parts (they are stored with `,`). The head's four separators sit right after
-- the quoted number and around the quoted status and priority, whose lengths are known; in the tail the
-- second one is the only `","` (timestamps hold no quotes). SQL over immutable calls, arguments plain columns: the
-- planner inlines them, so they cost what the expressions cost.
CREATE FUNCTION space_csv_head_sep(head text, num integer, status text, priority text, sep text) RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN '"' || num::text || '"' || sep
    || substr(head, length(num::text) + 4, length(head) - length(num::text) - length(status) - length(priority) - 10)
    || sep || '"' || status || '"' || sep || '"' || priority || '"' || sep;
COMMENT ON FUNCTION space_csv_head_sep(text, integer, text, text, text) IS 'csv_head with another separator.';

CREATE FUNCTION space_csv_tail_sep(tail text, sep text) RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN sep || substr(tail, 2, strpos(tail, '","') - 1) || sep || substr(tail, strpos(tail, '","') + 2);
COMMENT ON FUNCTION space_csv_tail_sep(text, text) IS 'csv_tail with another separator.';
"""

# Result chunks: lz4 when the server has it. Export text compresses about 4:1 at lz4's speed, so the
# worker's insert writes a quarter of the TOAST rows and WAL, and the download reads a quarter of the pages;
# both are faster than moving the bytes uncompressed (pglz, the default, is several times slower: not it).
CHUNK_COMPRESSION = """
DO $$ BEGIN
  IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
    ALTER TABLE export_chunks ALTER COLUMN data SET STORAGE EXTENDED, ALTER COLUMN data SET COMPRESSION lz4;
  END IF;
END $$;
"""

# The snapshot reads tasks in id order, and ids are random (uuid4): through (org_id, id) every task is a heap
# fetch from a random page, most of the read's cost at a million tasks. With the task's columns included in
# that index, the read is an index-only scan over pages in id order (about twice as fast end to end). The
# price: the index is about as large as the table, and a task UPDATE is no longer HOT (every one changes
# updated_at, an included column), so it writes new entries in each of the table's indexes.
SNAPSHOT_INDEX = """
CREATE INDEX tasks_snapshot_idx ON tasks (org_id, id)
  INCLUDE (project_id, title, status, due_date, created_at, updated_at);
DROP INDEX tasks_org_idx;
"""

COLUMNS = """
ALTER TABLE tickets
  ADD COLUMN csv_head text GENERATED ALWAYS AS (space_csv_head(number, title, status, priority)) STORED,
  ADD COLUMN csv_tail text GENERATED ALWAYS AS (space_csv_tail(created_at, updated_at)) STORED;
ALTER TABLE users
  ADD COLUMN csv_name text GENERATED ALWAYS AS (space_csv_quote(space_csv_guard(name))) STORED;
"""


def upgrade() -> None:
    op.execute(FUNCTIONS)
    op.execute(COLUMNS)
    op.execute(SNAPSHOT_INDEX)
    op.execute(CHUNK_COMPRESSION)


def downgrade() -> None:
    # Chunks already stored compressed stay readable; new ones are stored as before.
    op.execute(
        "ALTER TABLE export_chunks ALTER COLUMN data SET STORAGE EXTERNAL, ALTER COLUMN data SET COMPRESSION default;"
        " CREATE INDEX tasks_org_idx ON tasks (org_id, id); DROP INDEX tasks_snapshot_idx;"
        " ALTER TABLE users DROP COLUMN csv_name;"
        " ALTER TABLE tickets DROP COLUMN csv_tail, DROP COLUMN csv_head;"
        " DROP FUNCTION space_csv_tail_sep(text, text), space_csv_head_sep(text, integer, text, text, text),"
        " space_csv_tail(timestamptz, timestamptz), space_csv_head(integer, text, text, text),"
        " space_csv_ts(timestamptz);"
    )
