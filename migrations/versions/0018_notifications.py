"""notifications (SPEC §19): one row per recipient and channel, and each user's email preferences.

- `notifications` is a tenant table (RLS enabled and forced, the usual tenant policy) and the email outbox
  (`space.outbox`'s columns: state, attempts, next attempt, lease). An in-app row (`channel = 'app'`) is
  delivered by being written; an email row (`channel = 'email'`) is pending until the worker sends it, skips it
  (`skipped`: the recipient left the org, turned the type off, or email is off) or gives up (`failed`).
  `status` reads the state as §19 names it: a pending row that has been tried already is `retrying`.
- Its `type` is checked by form, not by a list: later event types (schedules, imports) need no migration.
- A user reads (and marks read) their own in-app rows across orgs without an org context: a SELECT and an
  UPDATE policy on `app.user_id` that also require a membership of the row's org, so an org the user left (or
  one purged) shows none. The user may change `read_at` and nothing else of them (column grants).
- `notification_preferences`: a user's table, like `link_mints` (per user over all their orgs): one row per event
  type the user set; a type with no row is on. The sender reads it with the recipient as `app.user_id`.
- The sweeper that re-sends emails whose queue entry was lost reads across orgs through
  `space_notifications_due_emails`, a SECURITY DEFINER function like `space_webhooks_due_deliveries`: ids only,
  pinned `search_path`, executable by `space_app` alone, with its own SELECT policy for a migrating role without
  BYPASSRLS.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

ORG = "nullif(current_setting('app.org_id', true), '')::uuid"
USER = "nullif(current_setting('app.user_id', true), '')::uuid"
OWN = (
    f"channel = 'app' AND user_id = {USER} AND EXISTS ("
    f"SELECT 1 FROM memberships m WHERE m.org_id = notifications.org_id AND m.user_id = {USER})"
)

UPGRADE = f"""
CREATE TABLE notifications (
  id uuid NOT NULL,
  org_id uuid NOT NULL REFERENCES organizations (id),
  user_id uuid NOT NULL REFERENCES users (id),
  channel text NOT NULL CHECK (channel IN ('app', 'email')),
  type text NOT NULL CHECK (type ~ '^[a-z]+(\\.[a-z_]+)+$'),
  export_id uuid,
  schedule_id uuid,
  import_id uuid,
  title text NOT NULL,
  details jsonb NOT NULL DEFAULT '{{}}',
  read_at timestamptz,
  state text NOT NULL DEFAULT 'pending'
    CHECK (state IN ('pending', 'sending', 'delivered', 'failed', 'skipped')),
  status text GENERATED ALWAYS AS (CASE WHEN state = 'pending' AND attempts > 0 THEN 'retrying' ELSE state END) STORED,
  attempts integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_expires_at timestamptz,
  finished_at timestamptz,
  last_error text,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, id),
  CHECK (channel = 'app' OR read_at IS NULL)
);
COMMENT ON COLUMN notifications.status IS
  'SPEC 19 states: pending, sending, retrying (pending after a failed attempt), delivered, failed, skipped.';
CREATE INDEX notifications_user_idx ON notifications (user_id, created_at DESC, id DESC) WHERE channel = 'app';
CREATE INDEX notifications_unread_idx ON notifications (user_id) WHERE channel = 'app' AND read_at IS NULL;
CREATE INDEX notifications_due_idx ON notifications (next_attempt_at)
  WHERE channel = 'email' AND state IN ('pending', 'sending');
-- An org's attempts in flight, counted at every outbound claim (space.outbox.in_flight; migration 0017's twin).
CREATE INDEX notifications_sending_idx ON notifications (org_id, lease_expires_at) WHERE state = 'sending';

GRANT SELECT, INSERT, DELETE ON notifications TO space_app;
GRANT UPDATE (read_at, state, attempts, next_attempt_at, lease_expires_at, finished_at, last_error)
  ON notifications TO space_app;
ALTER TABLE notifications ENABLE ROW LEVEL SECURITY;
ALTER TABLE notifications FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON notifications USING (org_id = {ORG}) WITH CHECK (org_id = {ORG});
CREATE POLICY own_notifications ON notifications FOR SELECT USING ({OWN});
CREATE POLICY own_notifications_read ON notifications FOR UPDATE USING ({OWN}) WITH CHECK ({OWN});

CREATE TABLE notification_preferences (
  user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  type text NOT NULL CHECK (type ~ '^[a-z]+(\\.[a-z_]+)+$'),
  email boolean NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (user_id, type)
);
ALTER TABLE notification_preferences ENABLE ROW LEVEL SECURITY;
ALTER TABLE notification_preferences FORCE ROW LEVEL SECURITY;
CREATE POLICY own_preferences ON notification_preferences USING (user_id = {USER}) WITH CHECK (user_id = {USER});
GRANT SELECT, INSERT, UPDATE, DELETE ON notification_preferences TO space_app;
"""

SWEEPER = """
-- What the sweeper reads, and no more: emails still to be sent.
CREATE POLICY maintenance_notifications ON notifications FOR SELECT TO CURRENT_USER
  USING (channel = 'email' AND state IN ('pending', 'sending'));

-- Pending emails overdue by `p_grace` (their queue entry is lost) and sending ones whose lease ran out (their
-- worker died). Ids only.
CREATE FUNCTION space_notifications_due_emails(p_limit integer, p_grace interval DEFAULT interval '1 minute')
  RETURNS TABLE (notification_id uuid, notification_org_id uuid, notification_attempts integer)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT n.id, n.org_id, n.attempts
  FROM public.notifications n
  WHERE n.channel = 'email'
    AND ((n.state = 'pending' AND n.next_attempt_at < clock_timestamp() - p_grace)
      OR (n.state = 'sending' AND n.lease_expires_at < clock_timestamp()))
  ORDER BY n.next_attempt_at
  LIMIT p_limit
$$;
COMMENT ON FUNCTION space_notifications_due_emails(integer, interval) IS
  'SPEC 19 notifications: emails whose queue entry was lost or whose worker died. Ids only.';
REVOKE ALL ON FUNCTION space_notifications_due_emails(integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_notifications_due_emails(integer, interval) TO space_app;
"""

DOWNGRADE = """
DROP FUNCTION IF EXISTS space_notifications_due_emails(integer, interval);
DROP TABLE IF EXISTS notification_preferences, notifications;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(SWEEPER)


def downgrade() -> None:
    op.execute(DOWNGRADE)
