"""imports (SPEC §23): restores of archives, the placeholder users they make, and the installation-wide id check.

- `imports` is a user's table, like `link_mints` and `notification_preferences`: one row per upload, read and
  written only with its importer as `app.user_id` (RLS enabled and forced). It names an org
  (`restored_org_id`) only once a restore completed, and that org's rows are the tenant tables'; the import row
  itself is the importer's, keyed `(user_id, id)`, and has no `org_id` column: it is no tenant row
  (docs/decisions/0098-restore.md says how it fits SPEC §28).
- `import_chunks`: the uploaded ZIP in pieces of a few MiB, the importer's like its import, until the restore
  ends (then deleted): the API that took the upload and the worker that restores it need share nothing else.
- `users.placeholder`: a user a restore made for a member's email that had no user here. It has no token; `space
  users add` with that email claims it (sets the name, clears the flag, prints a token), and the memberships the
  restore gave it are then theirs.
- `space_import_ids_in_use(uuid[])`: which of these ids a project, task or membership of any org already has
  (ids only; SECURITY DEFINER, pinned `search_path`, executable by `space_app` alone), so a restore keeps an
  archive's ids only where they are free in the whole installation, which RLS would hide from the app role.
  SELECT policies for the function's owner let it see every row when that role has no BYPASSRLS.
- `space_imports_waiting(interval, integer)`: imports queued for longer than the grace (their queue entry was
  lost after the commit), ids only, for the export lane's reconciler to enqueue again (the same kind of function).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

USER = "nullif(current_setting('app.user_id', true), '')::uuid"

UPGRADE = f"""
CREATE TABLE imports (
  id uuid NOT NULL,
  user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  name text NOT NULL,
  state text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'completed', 'failed')),
  progress integer NOT NULL DEFAULT 0 CHECK (progress BETWEEN 0 AND 100),
  phase text,
  dry_run boolean NOT NULL DEFAULT false,
  new_ids boolean NOT NULL DEFAULT false,
  restored_org_id uuid,  -- no foreign key: a local table may not reference the distributed root (SPEC §28)
  report jsonb,
  error_code text,
  error_detail text,
  byte_size bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz,
  PRIMARY KEY (user_id, id)
);
CREATE UNIQUE INDEX imports_id_key ON imports (id);
ALTER TABLE imports ENABLE ROW LEVEL SECURITY;
ALTER TABLE imports FORCE ROW LEVEL SECURITY;
CREATE POLICY own_imports ON imports USING (user_id = {USER}) WITH CHECK (user_id = {USER});
GRANT SELECT, INSERT ON imports TO space_app;
GRANT UPDATE (state, progress, phase, restored_org_id, report, error_code, error_detail, completed_at) ON imports TO space_app;

-- The upload itself, in pieces, until its restore ends: any worker of any host can read it.
CREATE TABLE import_chunks (
  user_id uuid NOT NULL,
  import_id uuid NOT NULL,
  seq integer NOT NULL,
  data bytea NOT NULL,
  PRIMARY KEY (user_id, import_id, seq),
  FOREIGN KEY (user_id, import_id) REFERENCES imports (user_id, id) ON DELETE CASCADE
);
ALTER TABLE import_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
ALTER TABLE import_chunks ENABLE ROW LEVEL SECURITY;
ALTER TABLE import_chunks FORCE ROW LEVEL SECURITY;
CREATE POLICY own_import_chunks ON import_chunks USING (user_id = {USER}) WITH CHECK (user_id = {USER});
GRANT SELECT, INSERT, DELETE ON import_chunks TO space_app;

ALTER TABLE users ADD COLUMN placeholder boolean NOT NULL DEFAULT false;
GRANT UPDATE (name, placeholder) ON users TO space_app;

CREATE POLICY import_ids ON projects FOR SELECT TO CURRENT_USER USING (true);
CREATE POLICY import_ids ON tasks FOR SELECT TO CURRENT_USER USING (true);
CREATE POLICY import_ids ON memberships FOR SELECT TO CURRENT_USER USING (true);

CREATE FUNCTION space_import_ids_in_use(p_ids uuid[])
  RETURNS TABLE (id uuid)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT p.id FROM public.projects p WHERE p.id = ANY (p_ids)
  UNION SELECT t.id FROM public.tasks t WHERE t.id = ANY (p_ids)
  UNION SELECT m.id FROM public.memberships m WHERE m.id = ANY (p_ids)
$$;
COMMENT ON FUNCTION space_import_ids_in_use(uuid[]) IS
  'SPEC 23 restore: which of these ids a project, task or membership of any org has. Ids only.';
REVOKE ALL ON FUNCTION space_import_ids_in_use(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_import_ids_in_use(uuid[]) TO space_app;

-- What the reconciler reads, and no more: imports still waiting for their job.
CREATE POLICY maintenance_imports ON imports FOR SELECT TO CURRENT_USER USING (state = 'queued');
CREATE FUNCTION space_imports_waiting(p_grace interval, p_limit integer)
  RETURNS TABLE (import_id uuid, import_user_id uuid)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT i.id, i.user_id FROM public.imports i
  WHERE i.state = 'queued' AND i.created_at < clock_timestamp() - p_grace
  ORDER BY i.created_at LIMIT p_limit
$$;
COMMENT ON FUNCTION space_imports_waiting(interval, integer) IS
  'SPEC 23 restore: imports queued longer than p_grace (their queue entry may be lost). Ids only.';
REVOKE ALL ON FUNCTION space_imports_waiting(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_imports_waiting(interval, integer) TO space_app;
"""

DOWNGRADE = """
DROP FUNCTION IF EXISTS space_imports_waiting(interval, integer);
DROP FUNCTION IF EXISTS space_import_ids_in_use(uuid[]);
DROP POLICY IF EXISTS import_ids ON projects;
DROP POLICY IF EXISTS import_ids ON tasks;
DROP POLICY IF EXISTS import_ids ON memberships;
REVOKE UPDATE (name, placeholder) ON users FROM space_app;
ALTER TABLE users DROP COLUMN IF EXISTS placeholder;
DROP TABLE IF EXISTS import_chunks, imports;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
