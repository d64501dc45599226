"""personal notifications (SPEC §19, §23): what a user is told of an event that has no org, `import.failed` first.

- `personal_notifications` is a user's table, like `imports` (migration 0022): keyed `(user_id, id)`, read and
  written only with its user as `app.user_id` (RLS enabled and forced), no `org_id` column, so it is no tenant
  row (SPEC §28: local, with imports; docs/decisions/0103). Its columns are `notifications`' less `org_id` and the
  org's things (`export_id`, `schedule_id`): one row per channel, the email rows an outbox (`space.outbox`'s
  columns), `status` as SPEC §19 names the state. An import it is about is its importer's own
  (`(user_id, import_id)` references `imports`; a user's removal takes both).
- The user may change `read_at` and the sender the outbox's columns, nothing else (column grants).
- The sweeper that re-sends emails whose queue entry was lost reads across users through
  `space_notifications_due_personal_emails`, a SECURITY DEFINER function like `space_notifications_due_emails`:
  ids only, pinned `search_path`, executable by `space_app` alone, with its own SELECT policy for a migrating role
  without BYPASSRLS.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

USER = "nullif(current_setting('app.user_id', true), '')::uuid"

UPGRADE = f"""
CREATE TABLE personal_notifications (
  user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  id uuid NOT NULL,
  channel text NOT NULL CHECK (channel IN ('app', 'email')),
  type text NOT NULL CHECK (type ~ '^[a-z]+(\\.[a-z_]+)+$'),
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
  PRIMARY KEY (user_id, id),
  FOREIGN KEY (user_id, import_id) REFERENCES imports (user_id, id) ON DELETE CASCADE,
  CHECK (channel = 'app' OR read_at IS NULL)
);
COMMENT ON COLUMN personal_notifications.status IS
  'SPEC 19 states: pending, sending, retrying (pending after a failed attempt), delivered, failed, skipped.';
CREATE INDEX personal_notifications_user_idx ON personal_notifications (user_id, created_at DESC, id DESC)
  WHERE channel = 'app';
CREATE INDEX personal_notifications_unread_idx ON personal_notifications (user_id)
  WHERE channel = 'app' AND read_at IS NULL;
CREATE INDEX personal_notifications_due_idx ON personal_notifications (next_attempt_at)
  WHERE channel = 'email' AND state IN ('pending', 'sending');

GRANT SELECT, INSERT ON personal_notifications TO space_app;
GRANT UPDATE (read_at, state, attempts, next_attempt_at, lease_expires_at, finished_at, last_error)
  ON personal_notifications TO space_app;
ALTER TABLE personal_notifications ENABLE ROW LEVEL SECURITY;
ALTER TABLE personal_notifications FORCE ROW LEVEL SECURITY;
CREATE POLICY own_personal_notifications ON personal_notifications
  USING (user_id = {USER}) WITH CHECK (user_id = {USER});
"""

SWEEPER = """
-- What the sweeper reads, and no more: emails still to be sent.
CREATE POLICY maintenance_personal_notifications ON personal_notifications FOR SELECT TO CURRENT_USER
  USING (channel = 'email' AND state IN ('pending', 'sending'));

-- Pending emails overdue by `p_grace` (their queue entry is lost) and sending ones whose lease ran out (their
-- worker died). Ids only.
CREATE FUNCTION space_notifications_due_personal_emails(p_limit integer, p_grace interval DEFAULT interval '1 minute')
  RETURNS TABLE (notification_id uuid, notification_user_id uuid, notification_attempts integer)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
  SELECT n.id, n.user_id, n.attempts
  FROM public.personal_notifications n
  WHERE n.channel = 'email'
    AND ((n.state = 'pending' AND n.next_attempt_at < clock_timestamp() - p_grace)
      OR (n.state = 'sending' AND n.lease_expires_at < clock_timestamp()))
  ORDER BY n.next_attempt_at
  LIMIT p_limit
$$;
COMMENT ON FUNCTION space_notifications_due_personal_emails(integer, interval) IS
  'SPEC 19 notifications of no org: emails whose queue entry was lost or whose worker died. Ids only.';
REVOKE ALL ON FUNCTION space_notifications_due_personal_emails(integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_notifications_due_personal_emails(integer, interval) TO space_app;
"""

DOWNGRADE = """
DROP FUNCTION IF EXISTS space_notifications_due_personal_emails(integer, interval);
DROP TABLE IF EXISTS personal_notifications;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(SWEEPER)


def downgrade() -> None:
    op.execute(DOWNGRADE)
