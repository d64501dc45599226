"""Foundation: roles, users and tokens, organizations, memberships, projects, tasks, tickets, exports, RLS.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ORG = "nullif(current_setting('app.org_id', true), '')::uuid"
USER = "nullif(current_setting('app.user_id', true), '')::uuid"
CUSTOMER = "nullif(current_setting('app.customer_id', true), '')::uuid"

# Tables that carry org_id: each gets RLS enabled and forced with a tenant policy.
TENANT_TABLES = [
    "memberships",
    "projects",
    "tasks",
    "ticket_counters",
    "tickets",
    "export_jobs",
    "export_chunks",
]

ROLES = """
-- Roles are cluster-wide, and no lock spans databases (advisory locks are per database): a migration of another
-- database on the same server (the test suite's workers on a new server) may create the same role at the same
-- moment, and one of the two then fails on pg_authid's unique index. The role exists either way, which is all
-- this needs.
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'space_app') THEN
    BEGIN
      CREATE ROLE space_app LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOINHERIT;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'space_queue') THEN
    BEGIN
      CREATE ROLE space_queue LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOINHERIT;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
  END IF;
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO space_app, space_queue', current_database());
END $$;
-- Roles are cluster-wide: whoever created space_queue already gave it its search_path (and on PostgreSQL 16+ an
-- ordinary owner may alter only the roles it created).
DO $$
BEGIN
  IF NOT EXISTS (
    SELECT FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
    WHERE r.rolname = 'space_queue' AND s.setdatabase = 0 AND 'search_path=saq' = ANY (s.setconfig)
  ) THEN
    BEGIN
      ALTER ROLE space_queue SET search_path = saq;
    EXCEPTION WHEN unique_violation THEN NULL;  -- set at the same moment by a migration of another database
    END;
  END IF;
END $$;
-- Giving a schema to another role takes membership in it, which an ordinary owner (managed PostgreSQL: CREATEDB,
-- CREATEROLE, no superuser) lacks. It then keeps the schema and lets the queue role create its tables there.
DO $$
BEGIN
  CREATE SCHEMA IF NOT EXISTS saq AUTHORIZATION space_queue;
EXCEPTION WHEN insufficient_privilege THEN
  CREATE SCHEMA IF NOT EXISTS saq;
  GRANT USAGE, CREATE ON SCHEMA saq TO space_queue;
END $$;
GRANT USAGE ON SCHEMA public TO space_app;
"""

TABLES = """
CREATE TABLE users (
  id uuid PRIMARY KEY,
  email text NOT NULL CHECK (email = lower(email)),
  name text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX users_email_key ON users (email);

CREATE TABLE api_tokens (
  id uuid PRIMARY KEY,
  user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  token_hash bytea NOT NULL UNIQUE,
  created_at timestamptz NOT NULL DEFAULT now(),
  revoked_at timestamptz
);
CREATE INDEX api_tokens_user_idx ON api_tokens (user_id);

CREATE TABLE organizations (
  id uuid PRIMARY KEY,
  name text NOT NULL,
  state text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended', 'deleting', 'deleted')),
  previous_state text CHECK (previous_state IN ('active', 'suspended')),
  delete_after timestamptz,
  deleted_at timestamptz,
  purged_counts jsonb,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE memberships (
  id uuid PRIMARY KEY,
  org_id uuid NOT NULL REFERENCES organizations (id),
  user_id uuid NOT NULL REFERENCES users (id),
  role text NOT NULL CHECK (role IN ('owner', 'admin', 'member', 'customer')),
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (org_id, user_id)
);
CREATE INDEX memberships_user_idx ON memberships (user_id);

CREATE TABLE projects (
  id uuid PRIMARY KEY,
  org_id uuid NOT NULL REFERENCES organizations (id),
  name text NOT NULL,
  version integer NOT NULL DEFAULT 1,
  deleted_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX projects_org_idx ON projects (org_id, id);

CREATE TABLE tasks (
  id uuid PRIMARY KEY,
  org_id uuid NOT NULL REFERENCES organizations (id),
  project_id uuid NOT NULL REFERENCES projects (id),
  title text NOT NULL,
  status text NOT NULL DEFAULT 'todo' CHECK (status IN ('todo', 'doing', 'done')),
  due_date date,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tasks_org_idx ON tasks (org_id, id);
CREATE INDEX tasks_project_idx ON tasks (project_id);

CREATE TABLE ticket_counters (
  org_id uuid PRIMARY KEY REFERENCES organizations (id),
  last_number integer NOT NULL DEFAULT 0
);

CREATE TABLE tickets (
  id uuid PRIMARY KEY,
  org_id uuid NOT NULL REFERENCES organizations (id),
  number integer NOT NULL,
  title text NOT NULL,
  body text NOT NULL DEFAULT '',
  status text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'pending', 'solved', 'closed')),
  priority text NOT NULL DEFAULT 'normal' CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
  creator_id uuid NOT NULL REFERENCES users (id),
  assignee_id uuid REFERENCES memberships (id) ON DELETE SET NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (org_id, number)
);
CREATE INDEX tickets_org_creator_idx ON tickets (org_id, creator_id, number);
CREATE INDEX tickets_org_assignee_idx ON tickets (org_id, assignee_id);

CREATE TABLE export_jobs (
  id uuid PRIMARY KEY,
  org_id uuid NOT NULL REFERENCES organizations (id),
  creator_id uuid NOT NULL REFERENCES users (id),
  kind text NOT NULL CHECK (kind IN ('snapshot', 'tickets_csv')),
  state text NOT NULL DEFAULT 'queued'
    CHECK (state IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
  progress integer NOT NULL DEFAULT 0 CHECK (progress BETWEEN 0 AND 100),
  error_code text,
  filters jsonb NOT NULL DEFAULT '{}',
  delimiter text NOT NULL DEFAULT ',' CHECK (delimiter IN (',', ';')),
  scope text NOT NULL CHECK (scope IN ('own', 'team')),
  attempt integer NOT NULL DEFAULT 0,
  execution_id uuid,
  lease_expires_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  snapshot_at timestamptz,
  completed_at timestamptz,
  expires_at timestamptz,
  purged_at timestamptz,
  row_count bigint,
  byte_size bigint,
  sha256 text
);
CREATE INDEX export_jobs_creator_idx ON export_jobs (org_id, creator_id, created_at DESC);
CREATE INDEX export_jobs_active_idx ON export_jobs (state) WHERE state IN ('queued', 'running');

CREATE TABLE export_chunks (
  export_id uuid NOT NULL REFERENCES export_jobs (id),
  execution_id uuid NOT NULL,
  seq integer NOT NULL,
  org_id uuid NOT NULL REFERENCES organizations (id),
  data bytea NOT NULL,
  PRIMARY KEY (export_id, execution_id, seq)
);
ALTER TABLE export_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
"""

GRANTS = """
GRANT SELECT, INSERT ON users TO space_app;
GRANT SELECT, INSERT, UPDATE ON api_tokens TO space_app;
GRANT SELECT, INSERT, UPDATE ON organizations TO space_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON memberships, projects, tasks, tickets, export_jobs, export_chunks
  TO space_app;
GRANT SELECT, INSERT, UPDATE ON ticket_counters TO space_app;
"""


def _policies() -> str:
    sql = []
    for table in TENANT_TABLES:
        scope = f"org_id = {ORG}"
        if table == "tickets":
            # Customers see only the tickets they created: a second setting, enforced here, not by a WHERE.
            scope = f"org_id = {ORG} AND ({CUSTOMER} IS NULL OR creator_id = {CUSTOMER})"
        sql.append(
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY; ALTER TABLE {table} FORCE ROW LEVEL SECURITY;"
            f" CREATE POLICY tenant_isolation ON {table} USING ({scope}) WITH CHECK ({scope});"
        )
    # A user may read their own memberships in every org (to list their orgs); writes stay per org.
    sql.append(f"CREATE POLICY own_memberships ON memberships FOR SELECT USING (user_id = {USER});")
    sql.append(
        "ALTER TABLE organizations ENABLE ROW LEVEL SECURITY; ALTER TABLE organizations FORCE ROW LEVEL SECURITY;"
        f" CREATE POLICY tenant_isolation ON organizations USING (id = {ORG}) WITH CHECK (id = {ORG});"
        " CREATE POLICY member_orgs ON organizations FOR SELECT USING (EXISTS ("
        f"SELECT 1 FROM memberships m WHERE m.org_id = organizations.id AND m.user_id = {USER}));"
    )
    return "\n".join(sql)


def upgrade() -> None:
    op.execute(ROLES)
    op.execute(TABLES)
    op.execute(GRANTS)
    op.execute(_policies())


def downgrade() -> None:
    op.execute(
        "DROP TABLE export_chunks, export_jobs, tickets, ticket_counters, tasks, projects, memberships,"
        " organizations, api_tokens, users"
    )
    # Roles are cluster-wide and may serve other databases: revoke here, never drop.
    op.execute("DROP SCHEMA IF EXISTS saq CASCADE")
    op.execute(
        "DO $$ BEGIN EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM space_app, space_queue',"
        " current_database()); END $$; REVOKE USAGE ON SCHEMA public FROM space_app;"
    )
