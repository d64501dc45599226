"""lifecycle: the one privileged cross-org read the purge needs, and the grants its batches use.

The purge finds due organizations through `space_maintenance_due_purges()`, a SECURITY DEFINER function
that returns ids only. Everything else it does runs as the app role inside one org's tenant context, so
RLS keeps applying to every row it deletes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = """
-- The function runs as its owner (the migrating role). If that role is not a superuser, FORCE RLS applies
-- to it too; this policy lets it, and only it, see which orgs are being deleted.
CREATE POLICY maintenance_due_purges ON organizations FOR SELECT TO CURRENT_USER
  USING (state = 'deleting');

CREATE FUNCTION space_maintenance_due_purges(max_orgs integer DEFAULT 100)
RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
  SELECT o.id FROM public.organizations o
  WHERE o.state = 'deleting' AND o.delete_after <= now()
  ORDER BY o.delete_after, o.id
  LIMIT greatest(max_orgs, 0)
$$;
COMMENT ON FUNCTION space_maintenance_due_purges(integer) IS
  'Cross-org maintenance read: ids of organizations in deleting whose grace period is over. Ids only.';
REVOKE ALL ON FUNCTION space_maintenance_due_purges(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_maintenance_due_purges(integer) TO space_app;

-- The purge deletes an org's counter row as the app role, under that org's tenant context.
GRANT DELETE ON ticket_counters TO space_app;
"""

DOWNGRADE = """
REVOKE DELETE ON ticket_counters FROM space_app;
DROP FUNCTION IF EXISTS space_maintenance_due_purges(integer);
DROP POLICY IF EXISTS maintenance_due_purges ON organizations;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
