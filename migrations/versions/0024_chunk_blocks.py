"""chunk blocks: where each 64 KiB block of a packed chunk starts in its lz4 frame, so a range enters at its block.

Until now a packed chunk was one lz4 frame of linked blocks (each block may refer to the one before), which only
expands from its start: a range in the middle of a 4 MiB chunk expanded the first half again and dropped it
(issue 35, docs/decisions 0101). The worker now writes frames of independent blocks and `blocks` lists the frame
offset (0-based) of each block; every block but the last expands to 64 KiB, so chunk byte `p` lies in block
`p // 65536`, and a range reads the frame from that block on behind the frame's own header. NULL for chunks
stored as they are, and for packed chunks written before this revision (read from their start, as before).

Downgrade: the column goes. Frames of independent blocks are ordinary lz4 frames, which 0022's reader expands
from their start as before; nothing is lost.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add `export_chunks.blocks` (a catalogue change only: no row is rewritten)."""
    op.execute(
        "ALTER TABLE export_chunks ADD COLUMN blocks integer[],"
        " ADD CONSTRAINT export_chunks_blocks_check CHECK (blocks IS NULL OR codec IS NOT NULL)"
    )


def downgrade() -> None:
    """Drop the column; the frames stay readable from their start."""
    op.execute("ALTER TABLE export_chunks DROP COLUMN blocks")
