"""webhooks: endpoints per org, one delivery per event and endpoint, one row per HTTP attempt (SPEC §12).

All three tables are tenant tables (RLS enabled and forced, the usual tenant policy). The endpoint keeps its
signing secret as it was shown once at creation: the sender must sign with it, so a one-way hash can't serve
(docs/decisions/0058-webhook-endpoints-and-secrets.md). The sweeper that re-sends deliveries whose queue entry
was lost reads across orgs through `space_webhooks_due_deliveries`, a SECURITY DEFINER function like 0003's:
ids only, pinned `search_path`, executable by `space_app` alone; for a migrating role without BYPASSRLS it has
its own SELECT policy (`TO CURRENT_USER`), as 0002's purge function has.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

ORG = "nullif(current_setting('app.org_id', true), '')::uuid"
TABLES = ("webhook_endpoints", "webhook_deliveries", "webhook_attempts")

UPGRADE = """
CREATE TABLE webhook_endpoints (
  id uuid PRIMARY KEY,
  org_id uuid NOT NULL REFERENCES organizations (id),
  url text NOT NULL,
  events text[] NOT NULL,
  secret text NOT NULL,
  created_by uuid REFERENCES users (id),
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_org_idx ON webhook_endpoints (org_id, created_at);

-- One row per (event, endpoint): the ledger of what must reach that endpoint. `body` is the exact bytes
-- signed and sent at every attempt. `attempts` fences each attempt's result (the worker that made attempt n
-- records it only while the row still says n and `sending`).
CREATE TABLE webhook_deliveries (
  id uuid PRIMARY KEY,
  org_id uuid NOT NULL REFERENCES organizations (id),
  endpoint_id uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
  event_id uuid NOT NULL,
  event_type text NOT NULL,
  body text NOT NULL,
  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sending', 'delivered', 'failed')),
  attempts integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_expires_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz,
  UNIQUE (endpoint_id, event_id)
);
CREATE INDEX webhook_deliveries_org_idx ON webhook_deliveries (org_id, endpoint_id);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE state IN ('pending', 'sending');

CREATE TABLE webhook_attempts (
  id uuid PRIMARY KEY,
  org_id uuid NOT NULL REFERENCES organizations (id),
  endpoint_id uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
  delivery_id uuid NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
  attempt integer NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  status text NOT NULL CHECK (status IN ('succeeded', 'failed')),
  response_code integer,
  error text
);
CREATE INDEX webhook_attempts_endpoint_idx ON webhook_attempts (org_id, endpoint_id, at DESC);
CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery_id);

GRANT SELECT, INSERT, DELETE ON webhook_endpoints, webhook_attempts TO space_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON webhook_deliveries TO space_app;
""" + "".join(
    f"ALTER TABLE {t} ENABLE ROW LEVEL SECURITY; ALTER TABLE {t} FORCE ROW LEVEL SECURITY;\n"
    f"CREATE POLICY tenant_isolation ON {t} USING (org_id = {ORG}) WITH CHECK (org_id = {ORG});\n"
    for t in TABLES
)

SWEEPER = """
-- What the sweeper reads, and no more: deliveries still to be made.
CREATE POLICY maintenance_webhook_deliveries ON webhook_deliveries FOR SELECT TO CURRENT_USER
  USING (state IN ('pending', 'sending'));

-- Pending deliveries overdue by `p_grace` (their queue entry is lost) and sending ones whose lease ran out
-- (their worker died). Ids only.
CREATE FUNCTION space_webhooks_due_deliveries(p_limit integer, p_grace interval DEFAULT interval '1 minute')
  RETURNS TABLE (delivery_id uuid, delivery_org_id uuid, delivery_attempts integer)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT d.id, d.org_id, d.attempts
  FROM public.webhook_deliveries d
  WHERE (d.state = 'pending' AND d.next_attempt_at < clock_timestamp() - p_grace)
     OR (d.state = 'sending' AND d.lease_expires_at < clock_timestamp())
  ORDER BY d.next_attempt_at
  LIMIT p_limit
$$;
COMMENT ON FUNCTION space_webhooks_due_deliveries(integer, interval) IS
  'SPEC 12 webhooks: deliveries whose queue entry was lost or whose worker died. Ids only.';
REVOKE ALL ON FUNCTION space_webhooks_due_deliveries(integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_webhooks_due_deliveries(integer, interval) TO space_app;
"""

DOWNGRADE = """
DROP FUNCTION IF EXISTS space_webhooks_due_deliveries(integer, interval);
DROP TABLE IF EXISTS webhook_attempts, webhook_deliveries, webhook_endpoints;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(SWEEPER)


def downgrade() -> None:
    op.execute(DOWNGRADE)
