"""limits: a user's exports counted across orgs, and the indexes the limits' counts use (SPEC §14).

The per-user export rate limit counts one user's exports in every org, but `export_jobs` is under RLS per
org. `space_exports_user_usage(user)` counts them as a SECURITY DEFINER function, like 0003's maintenance
reads: it returns three numbers for the one user it is given (no ids, no rows), pins `search_path`, and is
executable by `space_app` alone. An RLS policy for the app role was the alternative; it would let every
app query that forgets its org condition see the user's exports of other orgs, so it was not taken.

If the migrating role can't bypass RLS (no superuser, no BYPASSRLS), FORCE RLS applies to the function too. As 0002 does for the
purge, a SELECT-only policy for that role alone (`TO CURRENT_USER`) shows it the rows of the user the
function is counting, named by a setting the function sets for the length of the call.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE POLICY limits_user_usage ON export_jobs FOR SELECT TO CURRENT_USER
  USING (creator_id = nullif(current_setting('space.usage_user', true), '')::uuid);

-- counted: queued or running, or created within the window; active: queued or running; frees_in: seconds
-- until the oldest finished export of the window leaves it (NULL when none). Times: statement_timestamp(),
-- i.e. after the caller's lock waits, as the per-org count (space.exports.ledger.usage) measures them.
CREATE FUNCTION space_exports_user_usage(p_user uuid, p_window interval)
  RETURNS TABLE (counted bigint, active bigint, frees_in double precision)
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- Names the user for the policy above during this call only: cleared again before returning. (Not a SET
  -- clause on the function: for a custom setting that needs a superuser to create the function.)
  PERFORM set_config('space.usage_user', p_user::text, true);
  RETURN QUERY
    SELECT count(*),
           count(*) FILTER (WHERE j.state IN ('queued', 'running')),
           extract(epoch FROM min(j.created_at) FILTER (WHERE j.state NOT IN ('queued', 'running'))
                   + p_window - statement_timestamp())::double precision
    FROM public.export_jobs j
    WHERE j.creator_id = p_user
      AND (j.state IN ('queued', 'running') OR j.created_at > statement_timestamp() - p_window);
  PERFORM set_config('space.usage_user', '', true);
END
$$;
COMMENT ON FUNCTION space_exports_user_usage(uuid, interval) IS
  'SPEC 14 per-user export rate limit: one user''s active-or-recent exports over every org. Counts only.';
REVOKE ALL ON FUNCTION space_exports_user_usage(uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_exports_user_usage(uuid, interval) TO space_app;

-- The user's exports in time order (the function above; it runs at every export request).
CREATE INDEX export_jobs_user_idx ON export_jobs (creator_id, created_at);
-- An org's running exports and its oldest waiting ones (the claim's concurrency count and the wake-up).
CREATE INDEX export_jobs_org_active_idx ON export_jobs (org_id, created_at) WHERE state IN ('queued', 'running');
-- An org's stored results (the quota).
CREATE INDEX export_jobs_org_results_idx ON export_jobs (org_id) INCLUDE (byte_size, expires_at)
  WHERE state = 'completed' AND purged_at IS NULL AND deleted_at IS NULL;
-- A project's task list in page order.
CREATE INDEX tasks_project_order_idx ON tasks (project_id, created_at, id);
"""

DOWNGRADE = """
DROP INDEX IF EXISTS tasks_project_order_idx;
DROP INDEX IF EXISTS export_jobs_org_results_idx;
DROP INDEX IF EXISTS export_jobs_org_active_idx;
DROP INDEX IF EXISTS export_jobs_user_idx;
DROP FUNCTION IF EXISTS space_exports_user_usage(uuid, interval);
DROP POLICY IF EXISTS limits_user_usage ON export_jobs;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
