"""``privguard server-init``: the schema, an owner, a charging role and a ledger in PostgreSQL.

Run with a role that may create roles and schemas (a superuser, say). It
creates, unless they exist: the owner role (owns the schema, its tables and
functions; the only role that may retarget or write checkpoints), the
charging role (may only call the functions that lock, check and append), the
``privguard`` schema, and the ledger with the given target, created (or
resumed, if it exists with the same configuration) as the owner. It never
sets or prints a password: give the roles credentials with your usual tools
(``ALTER ROLE ... PASSWORD``, certificates, ``pg_hba.conf``).
"""

from __future__ import annotations

from typing import Any

from privguard._accounting import _config
from privguard._accounting._accounting import Accounting
from privguard._errors import InvalidArgumentError, LedgerStateError
from privguard._optional import require
from privguard._stores import _pgschema, _pgurl
from privguard._stores._postgres import PostgresStore

DEFAULT_OWNER = "privguard_owner"
DEFAULT_CHARGER = "privguard_charger"


def _role_name(role: Any) -> bool:
    """Whether ``role`` names a PostgreSQL role as written (task adv5): the server truncates
    a name past 63 bytes (NAMEDATALEN - 1), so a role of 40 "Ü" became another role of 31
    (the count was of characters); a lone surrogate raised UnicodeEncodeError out of
    server-init, and a NUL was reported as the server's failure, not as bad input.

    Example:
        >>> _role_name("trainer"), _role_name("Ü" * 32), _role_name("a\\x00b"), _role_name("pg_x")
        (True, False, False, False)
    """
    if not isinstance(role, str) or not role or role.startswith("pg_") or "\x00" in role:
        return False
    try:
        return len(role.encode("utf-8")) <= 63
    except UnicodeEncodeError:
        return False


def server_init(url: str, ledger: str, epsilon: float, delta: float, *,
                charger: str = DEFAULT_CHARGER, owner: str = DEFAULT_OWNER) -> dict[str, Any]:
    """Create (or check) the schema, the owner and charging roles, and the ledger.

    Returns:
        What exists now: schema owner, schema version (an existing schema of an older
        version is used as it is: ``server_upgrade`` upgrades it), charging role, ledger,
        target, and the URL a charging job uses.

    Raises:
        InvalidArgumentError: a malformed URL, ledger name, role or target.
        LedgerStateError: the database refused (permissions), or the ledger
            exists with another configuration.
    """
    pg = require("psycopg", "postgres")
    sql = pg.sql
    conninfo, in_url, shown = _pgurl.parse(url)
    if "ledger=" in url and in_url != ledger:
        raise InvalidArgumentError("ledger", ledger, f"must match the URL's ledger={in_url}")
    # validates the name, named as the caller passed it (review bd: it said path=, and
    # "a&sslmode=disable" or "a#b" passed as the URL's ledger "a", a name no URL reaches)
    try:
        named = _pgurl.parse(f"postgresql://x/y?ledger={ledger}")[1]
    except InvalidArgumentError as exc:
        raise InvalidArgumentError("ledger", ledger, exc.requirement) from None
    if named != ledger:
        raise InvalidArgumentError("ledger", ledger, "must be a ledger name alone (letters, "
                                   "digits, '_', '.' and '-'), which a URL's ledger= can name")
    for arg, role in (("charger", charger), ("owner", owner)):
        if not _role_name(role):
            raise InvalidArgumentError(arg, role, "must be a role name (1-63 bytes of UTF-8, "
                                       "no NUL, not starting with pg_)")
    if charger == owner:
        raise InvalidArgumentError("charger", charger, "must differ from the owner role")
    config = _config.build(epsilon, delta)
    try:
        with pg.connect(conninfo, autocommit=True, client_encoding="UTF8") as conn:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('privguard schema'))")
                for arg, role in (("charger", charger), ("owner", owner)):
                    # The server truncates a name to 63 bytes of the database's encoding,
                    # not UTF-8's (review radv5: 21 "万", 63 bytes of UTF-8, are 84 of
                    # EUC_TW, and became 15, another role, which then owned the schema).
                    if not conn.execute("SELECT %s::text::name::text = %s::text",
                                        (role, role)).fetchone()[0]:
                        raise InvalidArgumentError(arg, role, "must be a role name the server "
                                                   "keeps whole (at most 63 bytes in the "
                                                   "database's encoding)")
                for role in (owner, charger):
                    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                    (role,)).fetchone() is None:
                        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
                # A charge holds the head's lock for milliseconds; a session that sits in
                # an open transaction (a stopped or hostile job) must not hold it for long.
                conn.execute(sql.SQL("ALTER ROLE {} SET idle_in_transaction_session_timeout "
                                     "= '60s'").format(sql.Identifier(charger)))
                _refuse_powerful(conn, charger, owner, shown)
                me = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                                  ).fetchone()[0]
                if not me and not conn.execute("SELECT pg_has_role(current_user, %s, 'MEMBER')",
                                               (owner,)).fetchone()[0]:
                    conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(
                        sql.Identifier(owner)))
                schema_owner = conn.execute(
                    "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = "
                    "'privguard'").fetchone()
                if schema_owner is None:
                    conn.execute(sql.SQL("CREATE SCHEMA privguard AUTHORIZATION {}").format(
                        sql.Identifier(owner)))
                    conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(owner)))
                    for statement in _pgschema.STATEMENTS:
                        conn.execute(statement)
                elif schema_owner[0] != owner:
                    raise LedgerStateError(f"{shown}: schema privguard is owned by "
                                           f"{schema_owner[0]!r}, not {owner!r}")
        store = PostgresStore(_with_ledger(url, ledger), role=owner)
        try:
            acc = store.open(config, Accounting(config), None)
            schema_version = store._schema  # an existing schema is left at its version
        finally:
            store.close()
        with pg.connect(conninfo, autocommit=True, client_encoding="UTF8") as conn:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(owner)))
                for statement in _pgschema.grants(sql.Identifier(charger).as_string(conn)):
                    conn.execute(statement)
                conn.execute("INSERT INTO privguard.chargers VALUES (%s, %s) ON CONFLICT DO "
                             "NOTHING", (ledger, charger))
                _refuse_powerful(conn, charger, owner, shown)  # before the grants commit
    except pg.Error as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = _pgurl.scrub(detail, url)
        raise LedgerStateError(f"{shown}: server-init failed ({detail})") from exc
    return {"schema_owner": owner, "schema_version": schema_version,
            "charger": charger, "ledger": ledger,
            "target": [acc.config.epsilon, acc.config.delta],
            "charges": acc.journal.charges,
            "charger_url": _pgurl.with_user(_with_ledger(url, ledger), charger)}


def server_upgrade(url: str, *, lock_timeout: float = 10.0) -> dict[str, Any]:
    """``privguard server-upgrade``: bring a database's privguard schema to this privguard's
    version (version 2, main before task pgh, to 3), the explicit administrative step no open
    takes on its own (review rpgh).

    Run as the schema's owner or a role that may act as it (a superuser, say): one
    transaction, under the advisory lock ``server-init`` takes, as the owner; it waits at most
    ``lock_timeout`` seconds for a lock (a client's open holds the checkpoints' briefly), and
    then changes nothing. A schema already at this version is left alone. After it, privguard
    clients older than this one refuse the database (fail closed): upgrade them first.

    Returns:
        ``{"schema_owner", "from", "to"}``: the versions before and after.

    Raises:
        InvalidArgumentError: a malformed URL.
        LedgerStateError: no privguard schema there, a version this privguard cannot
            upgrade, a role that cannot act as the schema's owner, or the database refused
            (a lock not granted in time included; nothing was changed).
    """
    pg = require("psycopg", "postgres")
    sql = pg.sql
    conninfo, _, shown = _pgurl.parse(url)
    if not (isinstance(lock_timeout, (int, float)) and 0 < lock_timeout < 86400):
        raise InvalidArgumentError("lock_timeout", lock_timeout, "must be seconds, > 0")
    target = _pgschema.SCHEMA_VERSION
    try:
        with pg.connect(conninfo, autocommit=True, client_encoding="UTF8") as conn:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{max(1, int(lock_timeout * 1000))}ms'")
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('privguard schema'))")
                owner = conn.execute(
                    "SELECT pg_get_userbyid(nspowner), pg_has_role(current_user, nspowner, "
                    "'MEMBER') FROM pg_namespace WHERE nspname = 'privguard' AND "
                    "to_regclass('privguard.meta') IS NOT NULL").fetchone()
                if owner is None:
                    raise LedgerStateError(f"{shown}: this database has no privguard schema "
                                           "(privguard server-init creates it)")
                if not owner[1]:
                    raise LedgerStateError(
                        f"{shown}: schema privguard is owned by {owner[0]!r}: run "
                        "server-upgrade as that role or one that may act as it (a superuser)")
                conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(owner[0])))
                row = conn.execute("SELECT value FROM privguard.meta WHERE key = "
                                   "'schema_version'").fetchone()
                found = None if row is None else str(row[0])
                if found == str(target):
                    return {"schema_owner": owner[0], "from": target, "to": target}
                if found != "2":
                    raise LedgerStateError(
                        f"{shown}: privguard schema version {found} cannot be upgraded by "
                        f"this privguard (it upgrades 2 to {target})")
                for statement in _pgschema.MIGRATE_FROM_2:
                    conn.execute(statement)
    except pg.Error as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = _pgurl.scrub(detail, url)
        if isinstance(exc, pg.errors.LockNotAvailable):
            detail += ("; a client held a lock longer than the lock timeout: nothing was "
                       "changed, run it again")
        raise LedgerStateError(f"{shown}: server-upgrade failed ({detail})") from exc
    return {"schema_owner": owner[0], "from": 2, "to": target}


# Predefined roles whose members can write any table, server files or run programs.
_WRITERS = ("pg_write_all_data", "pg_write_server_files", "pg_execute_server_program")
_TABLES = ("meta", "ledgers", "chargers", "mechanisms", "entries", "checkpoints")


def _refuse_powerful(conn: Any, charger: str, owner: str, shown: str) -> None:
    """Refuse a charging role that could act as the owner, write a table or bypass a rule.

    The role model holds only if the charging role's sole way to write is the
    four charging functions: a role that may create roles can grant itself the
    owner role, and a member of ``pg_write_all_data`` can insert a checkpoint.
    Every role it can ``SET ROLE`` to counts as itself (``NOINHERIT`` or not).
    """
    reasons = []
    schema = conn.execute("SELECT to_regnamespace('privguard') IS NOT NULL").fetchone()[0]
    roles = [r for (r,) in conn.execute("SELECT rolname FROM pg_roles WHERE pg_has_role(%s, "
                                        "oid, 'MEMBER') ORDER BY rolname", (charger,))]
    for role in roles:
        via = "" if role == charger else f" (through role {role})"
        if role == owner or role in _WRITERS:
            reasons.append(f"membership in {role}")
        attrs = conn.execute("SELECT rolsuper, rolbypassrls, rolcreaterole FROM pg_roles "
                             "WHERE rolname = %s", (role,)).fetchone()
        reasons += [what + via for flag, what in zip(attrs, (
            "SUPERUSER", "BYPASSRLS", "CREATEROLE (it can grant itself any role)")) if flag]
        if not schema:
            continue
        if conn.execute("SELECT has_schema_privilege(%s, 'privguard', 'CREATE')",
                        (role,)).fetchone()[0]:
            reasons.append("CREATE on schema privguard" + via)
        reasons += [f"a write privilege on privguard.{table}{via}" for table in _TABLES
                    if conn.execute("SELECT has_table_privilege(%s, %s, 'INSERT, UPDATE, "
                                    "DELETE, TRUNCATE, TRIGGER')",
                                    (role, f"privguard.{table}")).fetchone()[0]]
        if conn.execute("SELECT has_function_privilege(%s, 'privguard.append_event(text, "
                        "text, bigint, text, text, text, text)', 'EXECUTE')",
                        (role,)).fetchone()[0]:
            reasons.append("EXECUTE on privguard.append_event (retargets)" + via)
    if schema:
        owned = conn.execute(
            "SELECT count(*) FROM (SELECT relowner AS o FROM pg_class WHERE relnamespace = "
            "'privguard'::regnamespace UNION ALL SELECT proowner FROM pg_proc WHERE "
            "pronamespace = 'privguard'::regnamespace UNION ALL SELECT nspowner FROM "
            "pg_namespace WHERE nspname = 'privguard') x WHERE pg_has_role(%s, x.o, 'MEMBER')",
            (charger,)).fetchone()[0]
        if owned:
            reasons.append(f"ownership of {owned} privguard objects")
    if reasons:
        raise LedgerStateError(
            f"{shown}: role {charger!r} cannot be a charging role: it has "
            f"{'; '.join(reasons)}. A charging role must be unable to act as the owner or to "
            "write privguard's tables; use a plain LOGIN role")


def _with_ledger(url: str, ledger: str) -> str:
    """``url`` with its ``ledger`` query parameter set to ``ledger``."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
             if k != "ledger"] + [("ledger", ledger)]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
