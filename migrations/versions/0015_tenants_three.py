"""tenants, turn three (SPEC §25): who created an org, the link-minting window, one link's ranges in the trail.

- `organizations.created_by`: `SPACE_ORGS_PER_USER` counts the orgs a user created (not deleted), whatever
  their role now, so handing an org to someone else frees no place and costs the other person none. Existing
  orgs get the member whose membership was written in the org's own creation transaction (the same `now()`,
  the creator's), else their earliest owner (whom the old rule counted), else no one. A SELECT policy on
  `app.user_id` lets the count see an org its creator has since been removed from.
- `link_mints`: the minute of links each user minted (`SPACE_LINK_RATE_LIMIT`). A user's table, not an org's:
  the limit is per user over all their orgs, which the per-org trail (RLS) can't count in one query. A mint
  removes that user's rows older than the window, so the table holds at most the limit per user.
- An index for "did this link have a ranged request audited in the last minute" (`audit.record_download`),
  answered from the trail itself: the trail stays append-only and remains the one record.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

USER = "nullif(current_setting('app.user_id', true), '')::uuid"

UPGRADE = f"""
ALTER TABLE organizations ADD COLUMN created_by uuid REFERENCES users (id);
COMMENT ON COLUMN organizations.created_by IS 'The user who created the org: SPACE_ORGS_PER_USER counts it for them.';
UPDATE organizations o SET created_by = coalesce(
  (SELECT m.user_id FROM memberships m WHERE m.org_id = o.id AND m.created_at <= o.created_at
   ORDER BY m.created_at, m.id LIMIT 1),
  (SELECT m.user_id FROM memberships m WHERE m.org_id = o.id AND m.role = 'owner'
   ORDER BY m.created_at, m.id LIMIT 1)
);
CREATE INDEX organizations_created_by_idx ON organizations (created_by) WHERE state <> 'deleted';
CREATE POLICY created_orgs ON organizations FOR SELECT USING (created_by = {USER});

CREATE TABLE link_mints (
  user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX link_mints_user_at_idx ON link_mints (user_id, at);
ALTER TABLE link_mints ENABLE ROW LEVEL SECURITY;
ALTER TABLE link_mints FORCE ROW LEVEL SECURITY;
CREATE POLICY own_mints ON link_mints USING (user_id = {USER}) WITH CHECK (user_id = {USER});
GRANT SELECT, INSERT, DELETE ON link_mints TO space_app;

CREATE INDEX audit_events_link_ranges_idx ON audit_events (org_id, (details->>'link'), at)
  WHERE action = 'export.downloaded' AND (details->>'link') IS NOT NULL;
"""

DOWNGRADE = """
DROP INDEX IF EXISTS audit_events_link_ranges_idx;
DROP TABLE IF EXISTS link_mints;
DROP POLICY IF EXISTS created_orgs ON organizations;
ALTER TABLE organizations DROP COLUMN IF EXISTS created_by;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
