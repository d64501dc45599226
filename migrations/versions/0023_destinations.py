"""destinations (SPEC §22): an org's own S3-compatible buckets, and the deliveries of exports into them.

- `destinations` is a tenant table keyed `(org_id, id)` (RLS enabled and forced, the usual tenant policy). The
  secret access key is kept only sealed (`secret_sealed`: AES-GCM under a key derived from the signing keys, its
  associated data the org and destination ids; `space.destinations.sealing`), never in plain text. The app role
  may change only `last_delivery_at` and `last_error` of a row (column grants): a destination is replaced, not
  edited.
- `destination_deliveries` is the deliveries' outbox (`space.outbox`'s columns: state, attempts, next attempt,
  lease), keyed `(org_id, id)`; its foreign key to the destination carries `org_id`, and a removed destination
  leaves its deliveries as history (`ON DELETE SET NULL (destination_id)`, PostgreSQL 15's column list). The
  export a delivery is of is named by `(org_id, export_id)` without a foreign key (the purge deletes deliveries
  before exports).
- `schedules.destination_id` gets its foreign key `(org_id, destination_id)`, and `paused_reason` admits
  `destination_failed` (a delivery that failed for good pauses its schedule, SPEC §22).
- The sweeper reads due deliveries across orgs through `space_destinations_due_deliveries`, a SECURITY DEFINER
  function like `space_webhooks_due_deliveries`: ids only, pinned `search_path`, executable by `space_app` alone.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

ORG = "nullif(current_setting('app.org_id', true), '')::uuid"

UPGRADE = f"""
CREATE TABLE destinations (
  org_id uuid NOT NULL REFERENCES organizations (id),
  id uuid NOT NULL,
  type text NOT NULL CHECK (type IN ('s3')),
  bucket text NOT NULL CHECK (bucket <> ''),
  prefix text NOT NULL DEFAULT '',
  region text,
  endpoint_url text,
  access_key_id text NOT NULL,
  secret_sealed bytea NOT NULL,
  created_by uuid REFERENCES users (id),
  created_at timestamptz NOT NULL DEFAULT now(),
  last_delivery_at timestamptz,
  last_error text,
  PRIMARY KEY (org_id, id)
);
GRANT SELECT, INSERT, DELETE ON destinations TO space_app;
GRANT UPDATE (last_delivery_at, last_error) ON destinations TO space_app;
ALTER TABLE destinations ENABLE ROW LEVEL SECURITY;
ALTER TABLE destinations FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON destinations USING (org_id = {ORG}) WITH CHECK (org_id = {ORG});

CREATE TABLE destination_deliveries (
  org_id uuid NOT NULL REFERENCES organizations (id),
  id uuid NOT NULL,
  export_id uuid NOT NULL,
  destination_id uuid,
  schedule_id uuid,
  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sending', 'delivered', 'failed')),
  attempts integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_expires_at timestamptz,
  finished_at timestamptz,
  delivered_at timestamptz,
  error_code text,
  last_error text,
  created_by uuid REFERENCES users (id),
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, id),
  FOREIGN KEY (org_id, destination_id) REFERENCES destinations (org_id, id) ON DELETE SET NULL (destination_id)
);
CREATE INDEX destination_deliveries_export_idx ON destination_deliveries (org_id, export_id, created_at DESC);
CREATE INDEX destination_deliveries_destination_idx ON destination_deliveries (org_id, destination_id);
CREATE INDEX destination_deliveries_due_idx ON destination_deliveries (next_attempt_at)
  WHERE state IN ('pending', 'sending');
-- An org's attempts in flight, counted at every outbound claim (space.outbox.in_flight).
CREATE INDEX destination_deliveries_sending_idx ON destination_deliveries (org_id, lease_expires_at)
  WHERE state = 'sending';
GRANT SELECT, INSERT, DELETE ON destination_deliveries TO space_app;
GRANT UPDATE (destination_id, state, attempts, next_attempt_at, lease_expires_at, finished_at, delivered_at,
  error_code, last_error) ON destination_deliveries TO space_app;
ALTER TABLE destination_deliveries ENABLE ROW LEVEL SECURITY;
ALTER TABLE destination_deliveries FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON destination_deliveries USING (org_id = {ORG}) WITH CHECK (org_id = {ORG});
"""

SWEEPER = """
CREATE POLICY maintenance_destination_deliveries ON destination_deliveries FOR SELECT TO CURRENT_USER
  USING (state IN ('pending', 'sending'));

CREATE FUNCTION space_destinations_due_deliveries(p_limit integer, p_grace interval DEFAULT interval '1 minute')
  RETURNS TABLE (delivery_id uuid, delivery_org_id uuid, delivery_attempts integer)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT d.id, d.org_id, d.attempts
  FROM public.destination_deliveries d
  WHERE (d.state = 'pending' AND d.next_attempt_at < clock_timestamp() - p_grace)
     OR (d.state = 'sending' AND d.lease_expires_at < clock_timestamp())
  ORDER BY d.next_attempt_at
  LIMIT p_limit
$$;
COMMENT ON FUNCTION space_destinations_due_deliveries(integer, interval) IS
  'SPEC 22 destinations: deliveries whose queue entry was lost or whose worker died. Ids only.';
REVOKE ALL ON FUNCTION space_destinations_due_deliveries(integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_destinations_due_deliveries(integer, interval) TO space_app;
"""

# A schedule names its destination (SPEC §21, §22): the key carries org_id, and a delivery that fails for good
# pauses the schedule as `destination_failed`.
SCHEDULES = """
ALTER TABLE schedules ADD CONSTRAINT schedules_destination_fkey
  FOREIGN KEY (org_id, destination_id) REFERENCES destinations (org_id, id);
ALTER TABLE schedules DROP CONSTRAINT schedules_paused_reason_check;
ALTER TABLE schedules ADD CONSTRAINT schedules_paused_reason_check
  CHECK (paused_reason IN ('user', 'failing', 'access_revoked', 'destination_failed'));
"""

DOWNGRADE = """
UPDATE schedules SET paused_reason = 'failing' WHERE paused_reason = 'destination_failed';
ALTER TABLE schedules DROP CONSTRAINT schedules_paused_reason_check;
ALTER TABLE schedules ADD CONSTRAINT schedules_paused_reason_check
  CHECK (paused_reason IN ('user', 'failing', 'access_revoked'));
ALTER TABLE schedules DROP CONSTRAINT schedules_destination_fkey;
UPDATE schedules SET destination_id = NULL;
DROP FUNCTION IF EXISTS space_destinations_due_deliveries(integer, interval);
DROP TABLE IF EXISTS destination_deliveries, destinations;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(SWEEPER)
    op.execute(SCHEDULES)


def downgrade() -> None:
    op.execute(DOWNGRADE)
