"""The PostgreSQL schema of the server store, where the database enforces append-only charging.

Everything lives in the schema ``privguard``, owned by the role that created
it (the *owner*). A *charging role* gets ``USAGE`` on the schema, ``SELECT``
on its tables and ``EXECUTE`` on four ``SECURITY DEFINER`` functions, and
nothing else: it can lock a ledger's head, register a mechanism, append a
run (or the one row that fixes the plan, before the first run) and raise the
count of the newest run. It cannot update or delete a row, change a target
or write a checkpoint. Row triggers hold the same rules for every role, the
owner's own functions included: journal rows are insert-only except that the
newest run's count may grow, a run's numbers are present and its times
finite, a checkpoint is written at the head only (on a row that has one, only
one of a newer curve version: schema 3), the head always describes the rows, the
configuration changes only together with an appended event row, and no
journal, head, mechanism or checkpoint row is ever deleted or updated.

What the database cannot check, the client does at every replay: each row's
digest chain, that every run is what the recorded budget admits, and that a
fix row holds what this library derives from its plan.
"""

from __future__ import annotations

# 2: NOT NULL run fields, finite times, mechanisms looked up by (digest, body) without a
# unique index on the body, checkpoints only at the head (version 1 was never released).
# 3 (task pgh): a checkpoint is keyed by (ledger, row, curve version), the version read from
# its snapshot by the database, so that the owner can put a checkpoint of today's curve
# version beside a stale one on the journal's head row (MIGRATE_FROM_2 upgrades a version-2
# schema in place; docs/theory.md §7, "A fresh checkpoint after such an open").
SCHEMA_VERSION = 3
READABLE_VERSIONS = frozenset({2, 3})
"""Schema versions this library reads and writes: a version-2 schema (main before task pgh)
is used as it is (its checkpoints: one per row, never replaced) until an administrator runs
:data:`UPGRADE_COMMAND` (review rpgh: no open migrates a schema, as no older client is locked
out of a shared server by a newer one's open)."""
UPGRADE_COMMAND = "privguard server-upgrade postgresql://ADMIN@HOST:PORT/DB"

# Functions a charging role may execute (signatures as GRANT spells them).
CHARGING_FUNCTIONS = [
    "privguard.lock_head(text)",
    "privguard.mechanism(text, text, text, text)",
    "privguard.append(text, text, bigint, text, bigint, text, bigint, bigint, double precision, "
    "double precision, text, text, text)",
    "privguard.extend(text, text, bigint, bigint, double precision, text, text)",
]

_CHECK_CALLER = """
  IF NOT (pg_catalog.pg_has_role(session_user, current_user, 'MEMBER') OR EXISTS (
      SELECT 1 FROM privguard.chargers c WHERE c.ledger = p_ledger
      AND pg_catalog.pg_has_role(session_user, c.role, 'MEMBER'))) THEN
    RAISE EXCEPTION 'privguard: role % may not charge ledger %', session_user, p_ledger
      USING ERRCODE = 'insufficient_privilege';
  END IF;
"""

_LOCK = """
  SELECT * INTO h FROM privguard.ledgers WHERE name = p_ledger FOR UPDATE;
  IF NOT FOUND OR h.ledger_id <> p_ledger_id THEN
    RAISE EXCEPTION 'privguard: ledger % is not the ledger this client opened', p_ledger
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
"""

_DEFINER = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"

# The curve version a checkpoint's snapshot names (``_rows.checkpoint_body``'s "curves"), 0
# where it names none or is no JSON: what the checkpoints table keys a checkpoint by. It
# orders checkpoints only; the reader trusts nothing of a checkpoint but what its MAC covers.
_SNAPSHOT_CURVES = """CREATE FUNCTION privguard.snapshot_curves(p_snapshot text)
       RETURNS integer LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    DECLARE v jsonb;
    BEGIN
      v := p_snapshot::jsonb -> 'curves';
      IF jsonb_typeof(v) = 'number' AND v::text ~ '^[0-9]{1,9}$' THEN
        RETURN v::text::integer;
      END IF;
      RETURN 0;
    EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
      RETURN 0;
    END $$"""

# A checkpoint is written at the journal's head only; on a row that has one, only one of a
# newer curve version (its stale one stays: checkpoints are never updated or deleted). A
# BEFORE trigger does not see the generated ``curves``: it computes it itself.
_GUARD_CHECKPOINT = """{verb} FUNCTION privguard.guard_checkpoint() RETURNS trigger
       LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM privguard.ledgers l WHERE l.name = NEW.ledger
                     AND l.entries = NEW.entries AND l.last_count = NEW.last_count
                     AND l.head = NEW.head AND l.prev = NEW.prev) THEN
        RAISE EXCEPTION 'privguard: a checkpoint is written at the journal''s head only'
          USING ERRCODE = 'check_violation';
      END IF;
      IF EXISTS (SELECT 1 FROM privguard.checkpoints c WHERE c.ledger = NEW.ledger
                 AND c.entries = NEW.entries
                 AND c.curves >= privguard.snapshot_curves(NEW.snapshot)) THEN
        RAISE EXCEPTION 'privguard: row % has a checkpoint of this curve version or a newer '
          'one', NEW.entries USING ERRCODE = 'check_violation';
      END IF;
      RETURN NEW;
    END $$"""

STATEMENTS = [
    "CREATE TABLE privguard.meta (key text PRIMARY KEY, value text NOT NULL)",
    f"INSERT INTO privguard.meta VALUES ('schema_version', '{SCHEMA_VERSION}')",
    """CREATE TABLE privguard.ledgers (
        name text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.-]{1,100}$'),
        ledger_id text NOT NULL UNIQUE,
        created double precision NOT NULL,
        keyed boolean NOT NULL,
        key_check text,
        genesis_config text NOT NULL,
        genesis text NOT NULL,
        config text NOT NULL,
        entries bigint NOT NULL CHECK (entries >= 0),
        last_count bigint NOT NULL CHECK (last_count >= 0),
        head text NOT NULL,
        prev text NOT NULL,
        mac text NOT NULL)""",
    """CREATE TABLE privguard.chargers (
        ledger text NOT NULL REFERENCES privguard.ledgers (name),
        role name NOT NULL,
        PRIMARY KEY (ledger, role))""",
    """CREATE TABLE privguard.mechanisms (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ledger text NOT NULL REFERENCES privguard.ledgers (name),
        body text NOT NULL,
        digest text NOT NULL)""",
    # A mechanism is found by its digest and body, under the ledger's lock (so never twice):
    # a row registered with a wrong digest is never returned for the right one. No unique
    # index on the body, which can exceed an index row (a raw RDP curve on a fine grid).
    "CREATE INDEX mechanisms_by_digest ON privguard.mechanisms (ledger, digest)",
    """CREATE TABLE privguard.entries (
        ledger text NOT NULL REFERENCES privguard.ledgers (name),
        idx bigint NOT NULL CHECK (idx >= 0),
        kind text NOT NULL CHECK (kind IN ('run', 'fix', 'event')),
        mech bigint REFERENCES privguard.mechanisms (id),
        label text,
        pid bigint,
        count bigint,
        first double precision,
        last double precision,
        body text,
        digest text NOT NULL,
        PRIMARY KEY (ledger, idx),
        CONSTRAINT run_fields CHECK (kind <> 'run' OR (
            mech IS NOT NULL AND count IS NOT NULL AND count >= 1 AND pid IS NOT NULL
            AND first IS NOT NULL AND last IS NOT NULL AND first > '-Infinity'::float8
            AND last < 'Infinity'::float8 AND last >= first AND body IS NULL)),
        CONSTRAINT body_fields CHECK (kind = 'run' OR (
            body IS NOT NULL AND mech IS NULL AND count IS NULL)))""",
    _SNAPSHOT_CURVES,
    """CREATE TABLE privguard.checkpoints (
        ledger text NOT NULL REFERENCES privguard.ledgers (name),
        entries bigint NOT NULL,
        last_count bigint NOT NULL,
        head text NOT NULL,
        prev text NOT NULL,
        snapshot text NOT NULL,
        mac text NOT NULL,
        curves integer NOT NULL GENERATED ALWAYS AS (privguard.snapshot_curves(snapshot))
          STORED,
        PRIMARY KEY (ledger, entries, curves))""",
    # -- triggers: the rules hold for every role, the owner's functions included ------------
    """CREATE FUNCTION privguard.refuse() RETURNS trigger LANGUAGE plpgsql
       SET search_path = pg_catalog, pg_temp AS $$
    BEGIN
      RAISE EXCEPTION 'privguard: % on %.% is refused: the ledger is append-only',
        TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';
    END $$""",
    """CREATE FUNCTION privguard.guard_entry() RETURNS trigger LANGUAGE plpgsql
       SET search_path = pg_catalog, pg_temp AS $$
    DECLARE n bigint;
    BEGIN
      SELECT entries INTO n FROM privguard.ledgers WHERE name = NEW.ledger;
      IF TG_OP = 'INSERT' THEN
        IF NEW.idx <> n THEN
          RAISE EXCEPTION 'privguard: journal row % is out of sequence (the journal has % rows)',
            NEW.idx, n USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
      END IF;
      IF NEW.ledger <> OLD.ledger OR NEW.idx <> OLD.idx OR NEW.kind <> OLD.kind
         OR NEW.mech IS DISTINCT FROM OLD.mech OR NEW.label IS DISTINCT FROM OLD.label
         OR NEW.pid IS DISTINCT FROM OLD.pid OR NEW.first IS DISTINCT FROM OLD.first
         OR NEW.body IS DISTINCT FROM OLD.body OR OLD.kind <> 'run'
         OR NOT coalesce(NEW.count > OLD.count AND NEW.last >= OLD.last, false)
         OR OLD.idx <> n - 1 THEN
        RAISE EXCEPTION 'privguard: a journal row never changes, except that the newest run''s '
          'count grows' USING ERRCODE = 'insufficient_privilege';
      END IF;
      RETURN NEW;
    END $$""",
    """CREATE FUNCTION privguard.guard_head() RETURNS trigger LANGUAGE plpgsql
       SET search_path = pg_catalog, pg_temp AS $$
    DECLARE r record;
    BEGIN
      IF TG_OP = 'INSERT' THEN
        IF NEW.entries <> 0 OR NEW.last_count <> 0 OR NEW.config <> NEW.genesis_config THEN
          RAISE EXCEPTION 'privguard: a new ledger starts empty at its genesis configuration'
            USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
      END IF;
      IF NEW.name <> OLD.name OR NEW.ledger_id <> OLD.ledger_id OR NEW.created <> OLD.created
         OR NEW.keyed <> OLD.keyed OR NEW.key_check IS DISTINCT FROM OLD.key_check
         OR NEW.genesis_config <> OLD.genesis_config OR NEW.genesis <> OLD.genesis THEN
        RAISE EXCEPTION 'privguard: a ledger''s identity and genesis never change'
          USING ERRCODE = 'insufficient_privilege';
      END IF;
      SELECT idx, kind, count INTO r FROM privguard.entries WHERE ledger = NEW.name
        ORDER BY idx DESC LIMIT 1;
      IF NEW.entries < OLD.entries OR (NEW.entries = OLD.entries
                                        AND NEW.last_count < OLD.last_count)
         OR NEW.entries <> coalesce(r.idx + 1, 0)
         OR NEW.last_count <> (CASE WHEN r.kind = 'run' THEN r.count ELSE 0 END) THEN
        RAISE EXCEPTION 'privguard: the head must describe the journal, which never shrinks'
          USING ERRCODE = 'insufficient_privilege';
      END IF;
      IF NEW.config <> OLD.config AND NOT (NEW.entries > OLD.entries AND r.kind = 'event') THEN
        RAISE EXCEPTION 'privguard: the configuration changes only with a logged event'
          USING ERRCODE = 'insufficient_privilege';
      END IF;
      RETURN NEW;
    END $$""",
    _GUARD_CHECKPOINT.format(verb="CREATE"),
    """CREATE TRIGGER checkpoints_at_head BEFORE INSERT ON privguard.checkpoints
       FOR EACH ROW EXECUTE FUNCTION privguard.guard_checkpoint()""",
    """CREATE TRIGGER entries_append_only BEFORE INSERT OR UPDATE ON privguard.entries
       FOR EACH ROW EXECUTE FUNCTION privguard.guard_entry()""",
    """CREATE TRIGGER head_monotone BEFORE INSERT OR UPDATE ON privguard.ledgers
       FOR EACH ROW EXECUTE FUNCTION privguard.guard_head()""",
    *[f"""CREATE TRIGGER {table}_no_delete BEFORE DELETE ON privguard.{table}
          FOR EACH ROW EXECUTE FUNCTION privguard.refuse()"""
      for table in ("entries", "ledgers", "mechanisms", "checkpoints", "chargers")],
    *[f"""CREATE TRIGGER {table}_no_update BEFORE UPDATE ON privguard.{table}
          FOR EACH ROW EXECUTE FUNCTION privguard.refuse()"""
      for table in ("mechanisms", "checkpoints", "chargers")],
    *[f"""CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON privguard.{table}
          FOR EACH STATEMENT EXECUTE FUNCTION privguard.refuse()"""
      for table in ("entries", "ledgers", "mechanisms", "checkpoints", "chargers")],
    # -- what a charging role may call --------------------------------------------------------
    f"""CREATE FUNCTION privguard.lock_head(p_ledger text)
       RETURNS TABLE (ledger_id text, entries bigint, last_count bigint, head text, prev text,
                      mac text)
       LANGUAGE plpgsql {_DEFINER} AS $$
    BEGIN
      {_CHECK_CALLER}
      RETURN QUERY SELECT l.ledger_id, l.entries, l.last_count, l.head, l.prev, l.mac
        FROM privguard.ledgers l WHERE l.name = p_ledger FOR UPDATE;
    END $$""",
    f"""CREATE FUNCTION privguard.mechanism(p_ledger text, p_ledger_id text, p_body text,
                                           p_digest text)
       RETURNS bigint LANGUAGE plpgsql {_DEFINER} AS $$
    DECLARE h record; v bigint;
    BEGIN
      {_CHECK_CALLER}
      {_LOCK}
      SELECT id INTO v FROM privguard.mechanisms WHERE ledger = p_ledger
        AND digest = p_digest AND body = p_body;
      IF v IS NULL THEN
        INSERT INTO privguard.mechanisms (ledger, body, digest)
          VALUES (p_ledger, p_body, p_digest) RETURNING id INTO v;
      END IF;
      RETURN v;
    END $$""",
    f"""CREATE FUNCTION privguard.append(p_ledger text, p_ledger_id text, p_idx bigint,
         p_kind text, p_mech bigint, p_label text, p_pid bigint, p_count bigint,
         p_first double precision, p_last double precision, p_body text, p_digest text,
         p_mac text)
       RETURNS void LANGUAGE plpgsql {_DEFINER} AS $$
    DECLARE h record;
    BEGIN
      {_CHECK_CALLER}
      {_LOCK}
      IF p_kind = 'fix' THEN
        IF EXISTS (SELECT 1 FROM privguard.entries e WHERE e.ledger = p_ledger
                   AND e.kind IN ('fix', 'run')) THEN
          RAISE EXCEPTION 'privguard: the plan is fixed once, before the first charge'
            USING ERRCODE = 'insufficient_privilege';
        END IF;
      ELSIF p_kind = 'run' THEN
        IF NOT EXISTS (SELECT 1 FROM privguard.mechanisms m WHERE m.id = p_mech
                       AND m.ledger = p_ledger) THEN
          RAISE EXCEPTION 'privguard: mechanism % is not registered for ledger %', p_mech,
            p_ledger USING ERRCODE = 'foreign_key_violation';
        END IF;
      ELSE
        RAISE EXCEPTION 'privguard: this function appends runs and the fixed plan, not %',
          p_kind USING ERRCODE = 'insufficient_privilege';
      END IF;
      INSERT INTO privguard.entries VALUES (p_ledger, p_idx, p_kind, p_mech, p_label, p_pid,
        p_count, p_first, p_last, p_body, p_digest);
      UPDATE privguard.ledgers SET entries = p_idx + 1, last_count = coalesce(p_count, 0),
        prev = h.head, head = p_digest, mac = p_mac WHERE name = p_ledger;
    END $$""",
    f"""CREATE FUNCTION privguard.extend(p_ledger text, p_ledger_id text, p_idx bigint,
         p_count bigint, p_last double precision, p_digest text, p_mac text)
       RETURNS void LANGUAGE plpgsql {_DEFINER} AS $$
    DECLARE h record;
    BEGIN
      {_CHECK_CALLER}
      {_LOCK}
      UPDATE privguard.entries SET count = p_count, last = p_last, digest = p_digest
        WHERE ledger = p_ledger AND idx = p_idx;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'privguard: no journal row %', p_idx USING ERRCODE = 'no_data_found';
      END IF;
      UPDATE privguard.ledgers SET last_count = p_count, head = p_digest, mac = p_mac
        WHERE name = p_ledger;
    END $$""",
    # -- the owner's alone --------------------------------------------------------------------
    f"""CREATE FUNCTION privguard.append_event(p_ledger text, p_ledger_id text, p_idx bigint,
         p_body text, p_digest text, p_mac text, p_config text)
       RETURNS void LANGUAGE plpgsql {_DEFINER} AS $$
    DECLARE h record;
    BEGIN
      {_LOCK}
      INSERT INTO privguard.entries (ledger, idx, kind, body, digest)
        VALUES (p_ledger, p_idx, 'event', p_body, p_digest);
      UPDATE privguard.ledgers SET entries = p_idx + 1, last_count = 0, prev = h.head,
        head = p_digest, mac = p_mac, config = coalesce(p_config, config)
        WHERE name = p_ledger;
    END $$""",
    # Nothing for PUBLIC: functions are executable by everyone unless revoked.
    "REVOKE ALL ON SCHEMA privguard FROM PUBLIC",
    "REVOKE ALL ON ALL TABLES IN SCHEMA privguard FROM PUBLIC",
    "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA privguard FROM PUBLIC",
]


MIGRATE_FROM_2 = [
    # The owner's, in one transaction under the schema's advisory lock (_pgadmin.server_upgrade).
    # Adding a stored generated column rewrites the table without firing a row trigger: the
    # rows stay as they are, each keyed by its snapshot's curve version.
    _SNAPSHOT_CURVES,
    "REVOKE ALL ON FUNCTION privguard.snapshot_curves(text) FROM PUBLIC",
    """ALTER TABLE privguard.checkpoints ADD COLUMN curves integer NOT NULL
       GENERATED ALWAYS AS (privguard.snapshot_curves(snapshot)) STORED""",
    "ALTER TABLE privguard.checkpoints DROP CONSTRAINT checkpoints_pkey",
    "ALTER TABLE privguard.checkpoints ADD PRIMARY KEY (ledger, entries, curves)",
    _GUARD_CHECKPOINT.format(verb="CREATE OR REPLACE"),
    f"UPDATE privguard.meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema_version'",
]
"""The statements that turn a version-2 schema into version 3 (task pgh)."""


def grants(role_sql: str) -> list[str]:
    """The statements that make ``role_sql`` (a quoted identifier) a charging role."""
    return [f"GRANT USAGE ON SCHEMA privguard TO {role_sql}",
            f"GRANT SELECT ON ALL TABLES IN SCHEMA privguard TO {role_sql}",
            *[f"GRANT EXECUTE ON FUNCTION {fn} TO {role_sql}" for fn in CHARGING_FUNCTIONS]]
