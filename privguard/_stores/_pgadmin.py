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

from privguard import _config
from privguard._accounting import Accounting
from privguard._errors import InvalidArgumentError, LedgerStateError
from privguard._optional import require
from privguard._stores import _pgschema, _pgurl
from privguard._stores._postgres import PostgresStore

DEFAULT_OWNER = "privguard_owner"
DEFAULT_CHARGER = "privguard_charger"


def server_init(url: str, ledger: str, epsilon: float, delta: float, *,
                charger: str = DEFAULT_CHARGER, owner: str = DEFAULT_OWNER) -> dict[str, Any]:
    """Create (or check) the schema, the owner and charging roles, and the ledger.

    Returns:
        What exists now: schema owner, charging role, ledger, target, and the
        URL a charging job uses.

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
    _pgurl.parse(f"postgresql://x/y?ledger={ledger}")  # validates the name
    for arg, role in (("charger", charger), ("owner", owner)):
        if not isinstance(role, str) or not role or len(role) > 63 or role.startswith("pg_"):
            raise InvalidArgumentError(arg, role, "must be a role name (1-63 characters, not "
                                       "starting with pg_)")
    if charger == owner:
        raise InvalidArgumentError("charger", charger, "must differ from the owner role")
    config = _config.build(epsilon, delta)
    try:
        with pg.connect(conninfo, autocommit=True) as conn:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('privguard schema'))")
                for role in (owner, charger):
                    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                    (role,)).fetchone() is None:
                        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
                # A charge holds the head's lock for milliseconds; a session that sits in
                # an open transaction (a stopped or hostile job) must not hold it for long.
                conn.execute(sql.SQL("ALTER ROLE {} SET idle_in_transaction_session_timeout "
                                     "= '60s'").format(sql.Identifier(charger)))
                bad = conn.execute(
                    "SELECT rolsuper OR rolbypassrls OR pg_has_role(%s, %s, 'MEMBER') FROM "
                    "pg_roles WHERE rolname = %s", (charger, owner, charger)).fetchone()[0]
                if bad:
                    raise LedgerStateError(
                        f"{shown}: role {charger!r} is a superuser or a member of {owner!r}; a "
                        "charging role must not be able to act as the owner")
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
        finally:
            store.close()
        with pg.connect(conninfo, autocommit=True) as conn:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(owner)))
                for statement in _pgschema.grants(sql.Identifier(charger).as_string(conn)):
                    conn.execute(statement)
                conn.execute("INSERT INTO privguard.chargers VALUES (%s, %s) ON CONFLICT DO "
                             "NOTHING", (ledger, charger))
    except pg.Error as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        secret = _pgurl.password(url)
        if secret:
            detail = detail.replace(secret, "***")
        raise LedgerStateError(f"{shown}: server-init failed ({detail})") from exc
    return {"schema_owner": owner, "charger": charger, "ledger": ledger,
            "target": [acc.config.epsilon, acc.config.delta],
            "charges": acc.journal.charges,
            "charger_url": _pgurl.with_user(_with_ledger(url, ledger), charger)}


def _with_ledger(url: str, ledger: str) -> str:
    """``url`` with its ``ledger`` query parameter set to ``ledger``."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
             if k != "ledger"] + [("ledger", ledger)]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
