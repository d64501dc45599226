"""installation: a stable id of this installation, which names its queue (issue 18).

Two installations that share a broker (staging and production on one Redis) must never see each other's
jobs. The id is created here, once, when `space migrate` first reaches this revision, and kept in the
database, so every API and worker host of the installation reads the same one with no configuration. It is
not a tenant table (no org_id): the app role may read it, nobody but the owner may change it.

Queue entries that earlier releases left under the old fixed queue name `space` in the database's own queue
are removed (when this role may): an unfinished one would hold its export's key there, where no worker of
the new name looks, and keep the export from being enqueued again. The ledger is the truth; the
reconciler enqueues its queued exports again under the new name.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE installation (
  -- One row only: the primary key can only be true.
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  id uuid NOT NULL DEFAULT gen_random_uuid(),
  created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE installation IS
  'This installation''s id (one row): it names the SAQ queue, so installations sharing a broker never meet.';
INSERT INTO installation DEFAULT VALUES;
GRANT SELECT ON installation TO space_app;

DO $$
BEGIN
  IF to_regclass('saq.saq_jobs') IS NULL THEN
    RETURN;
  END IF;
  IF has_table_privilege('saq.saq_jobs', 'DELETE') THEN
    DELETE FROM saq.saq_jobs WHERE queue = 'space';
  ELSE
    RAISE NOTICE 'saq.saq_jobs: no DELETE right; queue entries of the old queue name ''space'' are left'
      ' (delete them as space_queue: DELETE FROM saq.saq_jobs WHERE queue = ''space'')';
  END IF;
END
$$;
"""

DOWNGRADE = """
DROP TABLE IF EXISTS installation;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
