"""chunk codec: result chunks compressed by the worker (lz4 frames), not by the database.

0004 asked PostgreSQL to compress result chunks with lz4, which only a server built with lz4 can do; the
embedded server is not, and stored every result byte for byte through its TOAST table and WAL (the cost of an
export of wide rows, issue 17). Now the worker compresses each chunk itself before it stores it, whatever the
server: `codec` says how (`lz4`: one lz4 frame) and `raw_size` how many bytes the chunk holds once expanded, so
an offset is still a chunk number and a position in it. A chunk that would not shrink by a quarter is stored
as it is (both NULL), and read by parts as before. The column is stored EXTERNAL from now on: compressing an
lz4 frame again would spend the database's CPU for nothing. Existing chunks stay valid (both NULL).

Downgrade: chunks with a codec can't be read without it; the exports whose published execution has them are
marked purged (they read as expired) and the chunks deleted, RLS's force lifted for that (the owner's own rows
would otherwise be invisible to it under an ordinary owner). Upgrade order: run `space migrate`, then the API
hosts, then the workers: an API of 0012's code would read a packed chunk as it is stored.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE export_chunks
  ADD COLUMN codec text,
  ADD COLUMN raw_size integer,
  ADD CONSTRAINT export_chunks_codec_check CHECK (codec IN ('lz4')),
  ADD CONSTRAINT export_chunks_raw_size_check CHECK ((codec IS NULL) = (raw_size IS NULL) AND raw_size >= 0);
ALTER TABLE export_chunks ALTER COLUMN data SET STORAGE EXTERNAL, ALTER COLUMN data SET COMPRESSION default;
"""

DOWNGRADE = """
-- Both tables force RLS even on their owner, and a migration sets no tenant: under an ordinary owner (no
-- BYPASSRLS) the UPDATE and DELETE would match nothing. The owner lifts the force for this transaction only.
ALTER TABLE export_jobs NO FORCE ROW LEVEL SECURITY;
ALTER TABLE export_chunks NO FORCE ROW LEVEL SECURITY;
UPDATE export_jobs j SET purged_at = coalesce(j.purged_at, now())
WHERE EXISTS (SELECT 1 FROM export_chunks c
              WHERE c.export_id = j.id AND c.execution_id = j.execution_id AND c.codec IS NOT NULL);
DELETE FROM export_chunks WHERE codec IS NOT NULL;
DO $$ BEGIN
  IF EXISTS (SELECT 1 FROM export_chunks WHERE codec IS NOT NULL) THEN
    RAISE EXCEPTION 'packed result chunks are left; 0012 would serve them as they are stored';
  END IF;
END $$;
ALTER TABLE export_jobs FORCE ROW LEVEL SECURITY;
ALTER TABLE export_chunks FORCE ROW LEVEL SECURITY;
ALTER TABLE export_chunks DROP COLUMN codec, DROP COLUMN raw_size;
DO $$ BEGIN
  IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
    ALTER TABLE export_chunks ALTER COLUMN data SET STORAGE EXTENDED, ALTER COLUMN data SET COMPRESSION lz4;
  END IF;
END $$;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
