"""Back up and restore one server ledger's rows, as restoring an older database backup
leaves them (reviews pgx, rr)."""

from __future__ import annotations

import psycopg


def backup(srv, db: str, name: str) -> tuple[list, list]:
    """Ledger ``name``'s head row and journal rows, as a backup of the database holds them."""
    with psycopg.connect(srv.url(db=db), autocommit=True) as conn:
        head = conn.execute("SELECT * FROM privguard.ledgers WHERE name = %s",
                            (name,)).fetchall()
        rows = conn.execute("SELECT * FROM privguard.entries WHERE ledger = %s",
                            (name,)).fetchall()
    return head, rows


def restore(srv, db: str, name: str, backup: tuple[list, list]) -> None:
    """Put ledger ``name``'s head and journal back as :func:`backup` read them (as a
    superuser, past the append-only triggers): what restoring an older backup leaves."""
    (head,), rows = backup
    with psycopg.connect(srv.url(db=db), autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # no trigger fires
        conn.execute("DELETE FROM privguard.entries WHERE ledger = %s", (name,))
        conn.execute("DELETE FROM privguard.ledgers WHERE name = %s", (name,))
        conn.execute(f"INSERT INTO privguard.ledgers VALUES ({', '.join(['%s'] * len(head))})",
                     head)
        for row in rows:
            conn.execute(f"INSERT INTO privguard.entries VALUES "
                         f"({', '.join(['%s'] * len(row))})", row)
