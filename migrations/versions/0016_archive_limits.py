"""archive limits (SPEC §26, §27): a failed export keeps its failure's words.

`export_jobs.error_detail`: which limit an export passed (the complete archive's, per member file, or one
export's) and the setting that raises it, written with the failure. The API shows it as `errorDetail` and as
the detail of the result route's `export_failed`; the code alone can't say which of the kind's limits it was.
Existing rows keep none (NULL): their code still says what happened.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE export_jobs ADD COLUMN error_detail text;
COMMENT ON COLUMN export_jobs.error_detail IS 'A failure''s words for the owner: the limit passed and the setting that raises it.';
"""

DOWNGRADE = """
ALTER TABLE export_jobs DROP COLUMN error_detail;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
