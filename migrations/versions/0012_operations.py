"""operations: the export queue's depth for the metrics endpoints (SPEC §16), counted over every org.

`space_exports_queue_stats()` is a SECURITY DEFINER function like 0003's maintenance reads: it returns three
numbers (no ids, no rows), pins `search_path`, and is executable by `space_app` alone, so any API or worker
host reports the same depth, read from the ledger rather than from its own memory. Under an ordinary owner
(no BYPASSRLS) 0005's `maintenance_exports` policy already shows that owner the queued and running rows.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UPGRADE = """
-- waiting: queued, or running under a lease that ran out (a lost worker's, claimable again); running: under a
-- live lease; oldest_waiting_seconds: age of the oldest waiting export (NULL when none). Database clock.
CREATE FUNCTION space_exports_queue_stats()
  RETURNS TABLE (waiting bigint, running bigint, oldest_waiting_seconds double precision)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT count(*) FILTER (WHERE NOT live),
         count(*) FILTER (WHERE live),
         extract(epoch FROM clock_timestamp() - min(j.created_at) FILTER (WHERE NOT live))::double precision
  FROM (
    SELECT j.created_at, j.state = 'running' AND j.lease_expires_at >= clock_timestamp() AS live
    FROM public.export_jobs j
    WHERE j.state IN ('queued', 'running') AND j.deleted_at IS NULL
  ) j
$$;
COMMENT ON FUNCTION space_exports_queue_stats() IS
  'SPEC 16 metrics: exports waiting and running over every org, and the oldest wait. Counts only.';
REVOKE ALL ON FUNCTION space_exports_queue_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_exports_queue_stats() TO space_app;
"""

DOWNGRADE = """
DROP FUNCTION IF EXISTS space_exports_queue_stats();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
