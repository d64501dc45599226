"""archive: the export kind `archive` (SPEC §13), one ZIP of the snapshot, every ticket, a manifest and schemas.

`export_jobs.kind` is constrained by 0001's column CHECK (named `export_jobs_kind_check` by PostgreSQL);
it is replaced by one that also admits 'archive'. The downgrade refuses while archive rows exist (the
CHECK would not validate), rather than deleting anyone's exports.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Admit the archive kind."""
    op.execute(
        "ALTER TABLE export_jobs DROP CONSTRAINT export_jobs_kind_check,"
        " ADD CONSTRAINT export_jobs_kind_check CHECK (kind IN ('snapshot', 'tickets_csv', 'archive'))"
    )


def downgrade() -> None:
    """Back to the two kinds of 0001 (fails while archive exports exist)."""
    op.execute(
        "ALTER TABLE export_jobs DROP CONSTRAINT export_jobs_kind_check,"
        " ADD CONSTRAINT export_jobs_kind_check CHECK (kind IN ('snapshot', 'tickets_csv'))"
    )
