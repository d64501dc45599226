"""the outbound lane (SPEC §25): an index for an org's attempts in flight.

Every outbound claim (`space.outbox.in_flight`) counts the org's rows in state `sending` in each channel's table,
under the org's outbound lock; a partial index holds exactly those rows, so the count reads a handful of entries
whatever the table's history. A channel added later (email, destinations) gives its own table the same index.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE INDEX webhook_deliveries_sending_idx ON webhook_deliveries (org_id, lease_expires_at) WHERE state = 'sending';
"""

DOWNGRADE = """
DROP INDEX IF EXISTS webhook_deliveries_sending_idx;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
