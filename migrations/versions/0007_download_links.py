"""download links: the signing key every API host shares (SPEC §10).

A download link carries a token signed with HMAC-SHA256. When `SPACE_SECRET_KEY` is unset, the key is this
table's one row: 32 random bytes made here, once, by `space migrate` (Python's `secrets`, so no extension is
needed), so every API host verifies the links of every other host with no configuration. Not a tenant table
(no `org_id`): one key for the deployment. The app role may only read it; rotating it is an owner's UPDATE
(every link minted before then stops working, which for links of at most minutes is the point).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

KEY_BYTES = 32
"""HMAC-SHA256's block of security: a key as long as its output."""

UPGRADE = """
CREATE TABLE signing_keys (
  id smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
  secret bytea NOT NULL CHECK (length(secret) >= 32),
  created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE signing_keys IS 'The download-link signing key (SPEC 10) when SPACE_SECRET_KEY is unset.';
GRANT SELECT ON signing_keys TO space_app;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    secret = sa.bindparam("secret", secrets.token_bytes(KEY_BYTES), type_=sa.LargeBinary)
    op.execute(sa.text("INSERT INTO signing_keys (secret) VALUES (:secret)").bindparams(secret))


def downgrade() -> None:
    op.execute("DROP TABLE signing_keys")
