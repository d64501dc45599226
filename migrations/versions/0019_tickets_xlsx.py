"""tickets_xlsx: the export kind `tickets_xlsx` (SPEC §20), and each ticket's worksheet row kept on write.

- `export_jobs_kind_check` admits 'tickets_xlsx' (the downgrade refuses while such rows exist, as 0010's does).
- `tickets.xlsx_head`: `<row>` and the cells before the assignee (number, title, status, priority);
  `tickets.xlsx_tail`: the two date-time cells and `</row>`. STORED generated columns, as the CSV's (0004): XML
  escaping of the title (a regular expression and five replaces) and the timestamps' Excel serial numbers
  (numeric arithmetic) were most of a workbook's database cost when computed per export; stored, a row costs
  what a CSV record does. The assignee cell is looked up per export, as the CSV's is.

Cells carry no `r` reference (ECMA-376 makes it optional; readers place a cell after the one before it): the
row's text does not depend on where the row lands in the sheet, so it can be stored. Status and priority are
entries of the workbook's shared strings (a fixed table the writer puts in every workbook); other text is an inline
string exactly as the ticket has it, written in XML 1.0 (docs/decisions 0093):
- `&`, `<`, `>` as entities; CR as `&#13;` (a literal CR would be read back as LF);
- characters XML 1.0 cannot carry (C0 controls other than TAB, LF and CR; U+FFFE, U+FFFF) as `_xHHHH_`, Excel's
  own escape (ECMA-376 ST_Xstring), and the `_` of a literal `_xHHHH_` in the text as `_x005F_`, so Excel reads
  it back as written.
Dates are serial numbers (days since 1899-12-30, UTC) with twelve decimals: microseconds survive a round trip
through a double. Styles are fixed by the writer: `s="1"` is the date-time format (formats/tickets_xlsx.py).

Every function has an SQL-standard body or names `public.` for ours (docs/decisions 0005: pg_restore recomputes
the columns with an empty search_path).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

KINDS_BEFORE = "'snapshot', 'tickets_csv', 'archive'"

# PL/pgSQL: the escape is a sequence of steps, each skipped when its characters are absent (the usual title
# has none of them). IMMUTABLE is true: the result depends on the argument alone.
FUNCTIONS = r"""
CREATE FUNCTION space_xlsx_text(v text) RETURNS text
  LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
  t text := v;
  c integer;
BEGIN
  -- First the underscores: the escapes added below must stay escapes.
  IF strpos(t, '_x') > 0 THEN
    t := regexp_replace(t, '_(?=x[0-9A-Fa-f]{4}_)', '_x005F_', 'g');
  END IF;
  t := replace(replace(replace(replace(t, '&', '&amp;'), '<', '&lt;'), '>', '&gt;'), chr(13), '&#13;');
  IF t ~ '[\x01-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]' THEN
    FOREACH c IN ARRAY ARRAY[1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                             27, 28, 29, 30, 31, 65534, 65535] LOOP
      t := replace(t, chr(c), '_x' || lpad(upper(to_hex(c)), 4, '0') || '_');
    END LOOP;
  END IF;
  RETURN t;
END $$;
COMMENT ON FUNCTION space_xlsx_text(text) IS
  'Text as XML 1.0 content of an OOXML string: entities for & < > CR, _xHHHH_ for what XML cannot carry.';

-- xml:space="preserve" only where a reader would otherwise trim: text that starts or ends with white space.
CREATE FUNCTION space_xlsx_cell(v text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  RETURN '<c t="inlineStr"><is><t' || CASE WHEN v ~ '^[ \t\n\r]|[ \t\n\r]$' THEN ' xml:space="preserve">' ELSE '>' END
    || space_xlsx_text(v) || '</t></is></c>';
COMMENT ON FUNCTION space_xlsx_cell(text) IS 'One inline-string cell holding the text exactly.';

-- Status and priority name entries of the workbook's shared strings (their order is the writer's,
-- formats/tickets_xlsx.py SHARED_STRINGS: the header's seven names, then these); anything else is written inline.
CREATE FUNCTION space_xlsx_word(v text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  RETURN CASE v
    WHEN 'open' THEN '<c t="s"><v>7</v></c>' WHEN 'pending' THEN '<c t="s"><v>8</v></c>'
    WHEN 'solved' THEN '<c t="s"><v>9</v></c>' WHEN 'closed' THEN '<c t="s"><v>10</v></c>'
    WHEN 'low' THEN '<c t="s"><v>11</v></c>' WHEN 'normal' THEN '<c t="s"><v>12</v></c>'
    WHEN 'high' THEN '<c t="s"><v>13</v></c>' WHEN 'urgent' THEN '<c t="s"><v>14</v></c>'
    ELSE space_xlsx_cell(v) END;
COMMENT ON FUNCTION space_xlsx_word(text) IS 'A status or priority cell: its shared string, else the text inline.';

CREATE FUNCTION space_xlsx_serial(v timestamptz) RETURNS text
  LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$ BEGIN RETURN round(extract(epoch FROM v) / 86400 + 25569, 12)::text; END $$;
COMMENT ON FUNCTION space_xlsx_serial(timestamptz) IS
  'The Excel serial number of a moment in UTC (days since 1899-12-30), twelve decimals.';

CREATE FUNCTION space_xlsx_head(num integer, title text, status text, priority text) RETURNS text
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$ BEGIN
  RETURN '<row><c><v>' || num::text || '</v></c>' || public.space_xlsx_cell(title) || public.space_xlsx_word(status)
    || public.space_xlsx_word(priority);
END $$;
COMMENT ON FUNCTION space_xlsx_head(integer, text, text, text) IS
  'A worksheet row up to the assignee cell: number (a number), title (inline), status, priority (shared).';

CREATE FUNCTION space_xlsx_tail(created timestamptz, updated timestamptz) RETURNS text
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$ BEGIN
  RETURN '<c s="1"><v>' || public.space_xlsx_serial(created) || '</v></c><c s="1"><v>'
    || public.space_xlsx_serial(updated) || '</v></c></row>';
END $$;
COMMENT ON FUNCTION space_xlsx_tail(timestamptz, timestamptz) IS
  'A worksheet row after the assignee cell: createdAt and updatedAt as date-time cells (style 1), and </row>.';
"""

COLUMNS = """
ALTER TABLE tickets
  ADD COLUMN xlsx_head text GENERATED ALWAYS AS (space_xlsx_head(number, title, status, priority)) STORED,
  ADD COLUMN xlsx_tail text GENERATED ALWAYS AS (space_xlsx_tail(created_at, updated_at)) STORED;
"""


def upgrade() -> None:
    """Admit the tickets_xlsx kind; store each ticket's worksheet row."""
    op.execute(
        "ALTER TABLE export_jobs DROP CONSTRAINT export_jobs_kind_check,"
        f" ADD CONSTRAINT export_jobs_kind_check CHECK (kind IN ({KINDS_BEFORE}, 'tickets_xlsx'))"
    )
    op.execute(FUNCTIONS)
    op.execute(COLUMNS)


def downgrade() -> None:
    """Back to 0015 (fails while tickets_xlsx exports exist)."""
    op.execute(
        "ALTER TABLE tickets DROP COLUMN xlsx_tail, DROP COLUMN xlsx_head;"
        " DROP FUNCTION space_xlsx_tail(timestamptz, timestamptz), space_xlsx_head(integer, text, text, text),"
        " space_xlsx_serial(timestamptz), space_xlsx_word(text), space_xlsx_cell(text), space_xlsx_text(text);"
        " ALTER TABLE export_jobs DROP CONSTRAINT export_jobs_kind_check,"
        f" ADD CONSTRAINT export_jobs_kind_check CHECK (kind IN ({KINDS_BEFORE}))"
    )
