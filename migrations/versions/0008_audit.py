"""audit: an append-only audit trail per org (SPEC §12).

`audit_events` is a tenant table like the others (RLS enabled and forced, policies on `app.org_id`), but the
app role gets SELECT and INSERT only: no UPDATE, no DELETE, so a row once written stays as written. `seq`
orders the trail (rows of one transaction share their timestamp); the API's keyset cursor is made from it.

The purge must still remove an org's rows, and it runs as the app role. `space_audit_purge(org, n)` deletes
up to n rows of one org, and only of an org in `deleting` whose grace period is over and which is the
caller's tenant context: a SECURITY DEFINER function like 0002's and 0003's, pinned `search_path`, EXECUTE
for `space_app` alone. For a migrating role that can't bypass RLS, a DELETE policy for that role alone
(`TO CURRENT_USER`) lets the function see and delete the rows of the tenant context it runs in.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ORG = "nullif(current_setting('app.org_id', true), '')::uuid"

UPGRADE = f"""
CREATE TABLE audit_events (
  id uuid PRIMARY KEY,
  seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
  org_id uuid NOT NULL REFERENCES organizations (id),
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  actor_id uuid REFERENCES users (id),
  action text NOT NULL CHECK (action ~ '^[a-z_]+\\.[a-z_]+$'),
  target_type text NOT NULL,
  target_id text NOT NULL,
  ip inet,
  details jsonb NOT NULL DEFAULT '{{}}'::jsonb
);
-- The trail newest first, per org (the API's keyset pages).
CREATE INDEX audit_events_org_seq_idx ON audit_events (org_id, seq DESC);

ALTER TABLE audit_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_read ON audit_events FOR SELECT USING (org_id = {ORG});
CREATE POLICY tenant_insert ON audit_events FOR INSERT WITH CHECK (org_id = {ORG});
CREATE POLICY purge_audit ON audit_events FOR DELETE TO CURRENT_USER USING (org_id = {ORG});

-- Append-only for the app: no UPDATE, no DELETE.
GRANT SELECT, INSERT ON audit_events TO space_app;

CREATE FUNCTION space_audit_purge(p_org uuid, p_limit integer) RETURNS integer
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  n integer;
BEGIN
  -- Only the org the caller's transaction is about, and only once the purge may run for it (as the
  -- purge's own batches check under the org lock): the app can't use this to erase a live org's trail.
  IF p_org IS DISTINCT FROM {ORG} OR NOT EXISTS (
    SELECT 1 FROM public.organizations o
    WHERE o.id = p_org AND o.state = 'deleting' AND o.delete_after <= now()
  ) THEN
    RETURN 0;
  END IF;
  DELETE FROM public.audit_events
  WHERE ctid = ANY (ARRAY (SELECT ctid FROM public.audit_events WHERE org_id = p_org LIMIT p_limit));
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$$;
COMMENT ON FUNCTION space_audit_purge(uuid, integer) IS
  'SPEC 12: the purge removes a due org''s audit rows (the app role may not delete them itself).';
REVOKE ALL ON FUNCTION space_audit_purge(uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_audit_purge(uuid, integer) TO space_app;
"""

DOWNGRADE = """
DROP FUNCTION IF EXISTS space_audit_purge(uuid, integer);
DROP TABLE IF EXISTS audit_events;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
