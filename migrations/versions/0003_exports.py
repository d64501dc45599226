"""exports: the CSV formula guard, soft deletion of exports, and the privileged cross-org listings.

The reconciler and the cleanup must see every org's exports. They do it through the SECURITY DEFINER
functions below, which return ids only (no payload) and are executable by `space_app` alone; every write
that follows runs under the normal per-org RLS context. RLS is never switched off and nothing connects
as the owner. The functions run as the migrating role, which must bypass RLS (superuser or BYPASSRLS).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Leading characters that a spreadsheet may skip before a formula sign: every Unicode White_Space
# character plus the invisible separators (ZWSP..ZWJ, WORD JOINER, BOM). PostgreSQL's `\s` only knows ASCII.
_BLANKS = r"\u0020\u0009-\u000d\u0085\u00a0\u1680\u180e\u2000-\u200d\u2028\u2029\u202f\u205f\u2060\u3000\ufeff"
# = + - @, their full-width forms, and their small forms.
_SIGNS = r"\-=+@\uff1d\uff0b\uff0d\uff20\ufe62\ufe63\ufe66\ufe6b"
_GUARD_RE = rf"^(?:[\t\r\n]|[{_BLANKS}]*[{_SIGNS}])"

CSV_FUNCTIONS = f"""
CREATE FUNCTION space_csv_guard(v text) RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN CASE WHEN v ~ '{_GUARD_RE}' THEN '''' || v ELSE v END;
COMMENT ON FUNCTION space_csv_guard(text) IS
  'SPEC 7 formula guard: a leading quote when the cell starts with TAB/CR/LF or, after blanks, with = + - @.';

CREATE FUNCTION space_csv_quote(v text) RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN '"' || replace(coalesce(v, ''), '"', '""') || '"';
COMMENT ON FUNCTION space_csv_quote(text) IS 'One quoted CSV field (NULL is an empty field).';
"""

PRIVILEGED = """
CREATE FUNCTION space_exports_reconcile_candidates(p_limit integer)
  RETURNS TABLE (export_id uuid, export_org_id uuid, export_state text, export_attempt integer)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT j.id, j.org_id, j.state, j.attempt
  FROM public.export_jobs j
  WHERE j.deleted_at IS NULL
    AND (j.state = 'queued' OR (j.state = 'running' AND j.lease_expires_at < clock_timestamp()))
  ORDER BY j.created_at
  LIMIT p_limit
$$;

CREATE FUNCTION space_exports_expired_results(p_limit integer)
  RETURNS TABLE (export_id uuid, export_org_id uuid)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT j.id, j.org_id
  FROM public.export_jobs j
  WHERE j.state = 'completed' AND j.purged_at IS NULL AND j.expires_at <= clock_timestamp()
  ORDER BY j.expires_at
  LIMIT p_limit
$$;

-- Chunks are live only while they belong to the current execution of a running or completed, unpurged,
-- undeleted export. Everything else (stale workers, failures, cancels, purges) is an orphan.
CREATE FUNCTION space_exports_orphan_executions(p_limit integer)
  RETURNS TABLE (export_id uuid, export_org_id uuid, chunk_execution_id uuid)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT c.export_id, c.org_id, c.execution_id
  FROM public.export_chunks c
  WHERE NOT EXISTS (
    SELECT 1 FROM public.export_jobs j
    WHERE j.id = c.export_id AND j.execution_id = c.execution_id
      AND j.state IN ('running', 'completed') AND j.purged_at IS NULL AND j.deleted_at IS NULL
  )
  GROUP BY c.export_id, c.org_id, c.execution_id
  LIMIT p_limit
$$;

REVOKE ALL ON FUNCTION space_exports_reconcile_candidates(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION space_exports_expired_results(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION space_exports_orphan_executions(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_exports_reconcile_candidates(integer) TO space_app;
GRANT EXECUTE ON FUNCTION space_exports_expired_results(integer) TO space_app;
GRANT EXECUTE ON FUNCTION space_exports_orphan_executions(integer) TO space_app;
"""

TABLES = """
ALTER TABLE export_jobs ADD COLUMN deleted_at timestamptz;
CREATE INDEX export_jobs_expiry_idx ON export_jobs (expires_at) WHERE state = 'completed' AND purged_at IS NULL;
"""


def upgrade() -> None:
    op.execute(TABLES)
    op.execute(CSV_FUNCTIONS)
    op.execute(PRIVILEGED)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION space_exports_orphan_executions(integer), space_exports_expired_results(integer),"
        " space_exports_reconcile_candidates(integer), space_csv_quote(text), space_csv_guard(text);"
        " DROP INDEX export_jobs_expiry_idx; ALTER TABLE export_jobs DROP COLUMN deleted_at;"
    )
