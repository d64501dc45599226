"""snapshot text: whether a task's title needs escaping in JSON, computed on write.

An export of wide tasks spent about a third of the worker's read finding out, title by title, whether msgspec
would escape any of its bytes (a control character, `"` or a backslash): a title without one goes out as it is
stored. The answer is a pure function of the title, so PostgreSQL keeps it in a STORED generated column (as 0004
does for the CSV's cells), filled for existing rows when the column is added (a one-off table rewrite), and the
snapshot's covering index carries it, so the read stays an index-only scan.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The bytes msgspec escapes in a JSON string: U+0001-U+001F (text holds no NUL), '"' and '\'.
PLAIN = r"""title !~ '[\x01-\x1f"\\]'"""

UPGRADE = f"""
ALTER TABLE tasks ADD COLUMN title_plain boolean GENERATED ALWAYS AS ({PLAIN}) STORED;
COMMENT ON COLUMN tasks.title_plain IS 'The title holds no byte a JSON string escapes (the snapshot writes it as it is).';
DROP INDEX tasks_snapshot_idx;
CREATE INDEX tasks_snapshot_idx ON tasks (org_id, id)
  INCLUDE (project_id, title, title_plain, status, due_date, created_at, updated_at);
"""

DOWNGRADE = """
DROP INDEX tasks_snapshot_idx;
ALTER TABLE tasks DROP COLUMN title_plain;
CREATE INDEX tasks_snapshot_idx ON tasks (org_id, id)
  INCLUDE (project_id, title, status, due_date, created_at, updated_at);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
