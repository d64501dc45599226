"""schedules and incremental exports (SPEC §21).

- `schedules`: a tenant table keyed `(org_id, id)`, RLS enabled and forced with the usual tenant policy. A row is
  an owner's or admin's recurring export: its request (kind, filters, delimiter), its cadence (hour, day, week;
  UTC), whether its runs are incremental, and its state (paused and why, consecutive failures, next and last
  run). `destination_id` is carried without a foreign key (destinations are wired at merge).
- The cron finds due schedules across orgs through `space_schedules_due`, a SECURITY DEFINER function returning
  ids only (like `space_webhooks_due_deliveries`), with its own SELECT policy for a migrating role without
  BYPASSRLS; each run is then claimed under its org's tenant context with FOR UPDATE SKIP LOCKED.
- `export_jobs` gains `schedule_id` (foreign key `(org_id, schedule_id)`, set null when the schedule goes),
  `incremental`, `since`, `since_export_id`, and the run's own database snapshot (`xact_snapshot`, a
  `pg_snapshot`, with `xact_database`, the database's oid, so a run after a pg_restore is complete: decision
  0096). The per-user rate limit function no longer counts schedule runs (§21).
- `tickets`, `projects`, `tasks` gain `row_xid xid8`: the id of the transaction that last wrote the row, set by
  a BEFORE INSERT OR UPDATE trigger, with an index `(org_id, row_xid)`, so an incremental run reads the rows no
  earlier snapshot saw. Rows written before this migration keep NULL: every snapshot taken since sees them.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

ORG = "nullif(current_setting('app.org_id', true), '')::uuid"

SCHEDULES = f"""
CREATE TABLE schedules (
  id uuid NOT NULL,
  org_id uuid NOT NULL REFERENCES organizations (id),
  kind text NOT NULL CHECK (kind IN ('snapshot', 'tickets_csv', 'tickets_xlsx', 'archive')),
  filters jsonb NOT NULL DEFAULT '{{}}',
  delimiter text NOT NULL DEFAULT ',' CHECK (delimiter IN (',', ';')),
  every text NOT NULL CHECK (every IN ('hour', 'day', 'week')),
  at_minute integer NOT NULL DEFAULT 0 CHECK (at_minute BETWEEN 0 AND 1439),
  weekday integer CHECK (weekday BETWEEN 1 AND 7),
  incremental boolean NOT NULL DEFAULT false,
  destination_id uuid,
  paused boolean NOT NULL DEFAULT false,
  paused_reason text CHECK (paused_reason IN ('user', 'failing', 'access_revoked')),
  consecutive_failures integer NOT NULL DEFAULT 0,
  created_by uuid NOT NULL REFERENCES users (id),
  created_at timestamptz NOT NULL DEFAULT now(),
  next_run_at timestamptz NOT NULL,
  last_run_at timestamptz,
  last_export_id uuid,
  PRIMARY KEY (org_id, id),
  CHECK (every = 'week' OR weekday IS NULL)
);
CREATE INDEX schedules_due_idx ON schedules (next_run_at) WHERE NOT paused;
GRANT SELECT, INSERT, UPDATE, DELETE ON schedules TO space_app;
ALTER TABLE schedules ENABLE ROW LEVEL SECURITY;
ALTER TABLE schedules FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON schedules USING (org_id = {ORG}) WITH CHECK (org_id = {ORG});
CREATE POLICY maintenance_schedules ON schedules FOR SELECT TO CURRENT_USER USING (NOT paused);

-- Schedules due now, oldest first: ids only (the cron claims each under its org's context).
CREATE FUNCTION space_schedules_due(p_limit integer)
  RETURNS TABLE (schedule_id uuid, schedule_org_id uuid)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT s.id, s.org_id FROM public.schedules s
  WHERE NOT s.paused AND s.next_run_at <= clock_timestamp()
  ORDER BY s.next_run_at
  LIMIT p_limit
$$;
COMMENT ON FUNCTION space_schedules_due(integer) IS 'SPEC 21 schedules: the due ones, ids only.';
REVOKE ALL ON FUNCTION space_schedules_due(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_schedules_due(integer) TO space_app;

ALTER TABLE export_jobs
  ADD COLUMN schedule_id uuid,
  ADD COLUMN incremental boolean NOT NULL DEFAULT false,
  ADD COLUMN since timestamptz,
  ADD COLUMN since_export_id uuid,
  ADD COLUMN xact_snapshot pg_snapshot,
  ADD COLUMN xact_database oid,
  ADD CONSTRAINT export_jobs_schedule_fk FOREIGN KEY (org_id, schedule_id)
    REFERENCES schedules (org_id, id) ON DELETE SET NULL (schedule_id);
-- A schedule's runs, newest first (its page, and the previous successful run of an incremental one).
CREATE INDEX export_jobs_schedule_idx ON export_jobs (org_id, schedule_id, created_at DESC)
  WHERE schedule_id IS NOT NULL;
"""

USAGE = """
CREATE OR REPLACE FUNCTION space_exports_user_usage(p_user uuid, p_window interval)
  RETURNS TABLE (counted bigint, active bigint, frees_in double precision)
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM set_config('space.usage_user', p_user::text, true);
  RETURN QUERY
    SELECT count(*),
           count(*) FILTER (WHERE j.state IN ('queued', 'running')),
           extract(epoch FROM min(j.created_at) FILTER (WHERE j.state NOT IN ('queued', 'running'))
                   + p_window - statement_timestamp())::double precision
    FROM public.export_jobs j
    WHERE j.creator_id = p_user
      AND j.schedule_id IS NULL{extra}
      AND (j.state IN ('queued', 'running') OR j.created_at > statement_timestamp() - p_window);
  PERFORM set_config('space.usage_user', '', true);
END
$$;
"""

ROW_XID = """
CREATE FUNCTION space_row_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.row_xid := pg_current_xact_id();
  RETURN NEW;
END
$$;
COMMENT ON FUNCTION space_row_xid() IS
  'SPEC 21 incremental exports: stamps a row with the id of the transaction that wrote it.';
"""

XID_TABLES = ("tickets", "projects", "tasks")


def upgrade() -> None:
    op.execute(SCHEDULES)
    op.execute(USAGE.replace("{extra}", ""))
    op.execute(ROW_XID)
    for table in XID_TABLES:
        op.execute(
            f"ALTER TABLE {table} ADD COLUMN row_xid xid8;"
            f" CREATE TRIGGER {table}_row_xid BEFORE INSERT OR UPDATE ON {table}"
            f" FOR EACH ROW EXECUTE FUNCTION space_row_xid();"
            f" CREATE INDEX {table}_row_xid_idx ON {table} (org_id, row_xid);"
        )


def downgrade() -> None:
    for table in XID_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_row_xid ON {table}; ALTER TABLE {table} DROP COLUMN row_xid;")
    op.execute("DROP FUNCTION IF EXISTS space_row_xid()")
    # The usage function as 0006 made it: without the schedule condition.
    op.execute(USAGE.replace("\n      AND j.schedule_id IS NULL{extra}", ""))
    op.execute(
        "ALTER TABLE export_jobs DROP CONSTRAINT IF EXISTS export_jobs_schedule_fk,"
        " DROP COLUMN schedule_id, DROP COLUMN incremental, DROP COLUMN since, DROP COLUMN since_export_id,"
        " DROP COLUMN xact_snapshot, DROP COLUMN xact_database"
    )
    op.execute("DROP FUNCTION IF EXISTS space_schedules_due(integer); DROP TABLE IF EXISTS schedules")
