"""A real, throw-away PostgreSQL server for the tests and the store benchmark.

``server()`` starts one (once per process) with ``initdb`` and ``pg_ctl`` in a
new temporary directory, listening on 127.0.0.1 on a free port, with password
(SCRAM) authentication; the passwords live in a passfile named by
``PGPASSFILE``, so URLs never carry one. PostgreSQL refuses to run as root:
as root, the server runs as the ``postgres`` system user (created if
missing), which then owns the data and socket directories. ``stop()`` (also
registered with :mod:`atexit`) shuts it down and removes the directory.

``binaries()`` returns None where no PostgreSQL server is installed; the tests
skip then, and only then, except under ``CI=true``, where they fail (the
``pg_server`` fixture in conftest.py): CI must never pass without the server store.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import uuid

SUPERUSER = "pgadmin"
OWNER = "budget_owner"
CHARGER = "trainer"


def binaries() -> str | None:
    """The directory holding initdb and pg_ctl (15 preferred), or None."""
    candidates = [os.environ.get("PRIVGUARD_PG_BIN", "")]
    candidates += ["/usr/lib/postgresql/15/bin"]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    found = shutil.which("initdb")
    if found:
        candidates.append(os.path.dirname(found))
    for folder in candidates:
        if folder and all(os.access(os.path.join(folder, b), os.X_OK)
                          for b in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


SKIP_REASON = ("no PostgreSQL server binaries (initdb, pg_ctl, postgres) in "
               "/usr/lib/postgresql/*/bin, $PRIVGUARD_PG_BIN or PATH: install Debian's "
               "postgresql-15 to run the server-store tests")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One running server: its URLs, and ways to stop, restart and administer it."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        self.port = _free_port()
        self.root = tempfile.mkdtemp(prefix="privguard-pg-")
        self.data = os.path.join(self.root, "data")
        self.socket_dir = os.path.join(self.root, "sock")
        self.log = os.path.join(self.root, "server.log")
        self.passwords = {name: secrets.token_hex(12) for name in (SUPERUSER, OWNER, CHARGER)}
        self.passfile = os.path.join(self.root, "pgpass")
        self.run_as: str | None = None
        self._started = False
        if os.geteuid() == 0:
            self.run_as = _system_user()
        os.makedirs(self.socket_dir)
        pwfile = os.path.join(self.root, "pw")
        with open(pwfile, "w") as fh:
            fh.write(self.passwords[SUPERUSER] + "\n")
        with open(self.passfile, "w") as fh:
            for name, pw in self.passwords.items():
                fh.write(f"127.0.0.1:{self.port}:*:{name}:{pw}\n")
        os.chmod(self.passfile, 0o600)
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            os.chmod(self.root, 0o711)
            for path in (self.socket_dir, pwfile, self.root):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._cmd(["initdb", "-D", self.data, "-U", SUPERUSER, "--auth=scram-sha-256",
                   f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C", "--no-sync"])
        os.remove(pwfile)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as fh:
            fh.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                     f"unix_socket_directories = '{self.socket_dir}'\n"
                     "max_connections = 60\nshared_buffers = 32MB\n"
                     "fsync = on\nsynchronous_commit = on\n")
        self.start()

    def _cmd(self, argv: list[str], timeout: float = 120) -> str:
        argv = [os.path.join(self.bindir, argv[0]), *argv[1:]]
        if self.run_as is not None:
            argv = ["runuser", "-u", self.run_as, "--", *argv]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): "
                               f"{out.stdout}{out.stderr}")
        return out.stdout

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self._cmd(["pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start"])
        self._started = True

    def stop(self, mode: str = "fast") -> None:
        if self._started:
            self._started = False
            self._cmd(["pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop"])

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- URLs and administration -------------------------------------------------------
    def url(self, user: str = SUPERUSER, db: str = "postgres", ledger: str | None = None) -> str:
        base = f"postgresql://{user}@127.0.0.1:{self.port}/{db}"
        return base if ledger is None else f"{base}?ledger={ledger}"

    def admin(self, sql: str, params: tuple = (), db: str = "postgres",
              user: str = SUPERUSER) -> list[tuple]:
        """Run one statement (autocommit) and return its rows, if any."""
        import psycopg

        with psycopg.connect(self.url(user, db), autocommit=True) as conn:
            cur = conn.execute(sql, params or None)
            return cur.fetchall() if cur.description is not None else []

    def set_passwords(self) -> None:
        """Give the owner and charging roles (made by server-init) their test passwords."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            for name in (OWNER, CHARGER):
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(self.passwords[name])))

    def new_database(self) -> str:
        name = "db_" + uuid.uuid4().hex[:12]
        self.admin(f"CREATE DATABASE {name}")
        return name


def _system_user() -> str:
    for name in ("postgres", "privguard-pg"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "privguard-pg"], check=True, capture_output=True)
    return "privguard-pg"


_SERVER: Server | None = None
_DATABASE: str | None = None


def initialised_database() -> str:
    """A database where ``privguard server-init`` made the test owner and charging roles
    (with their passwords), created once per process."""
    global _DATABASE
    if _DATABASE is None:
        from privguard._stores._pgadmin import server_init

        srv = server()
        db = srv.new_database()
        server_init(srv.url(db=db), "setup", 1.0, 1e-5, charger=CHARGER, owner=OWNER)
        srv.set_passwords()
        _DATABASE = db
    return _DATABASE


def allow_charger(db: str, ledger: str) -> None:
    """Let the test charging role charge ``ledger`` (what server-init does for its ledger)."""
    server().admin("INSERT INTO privguard.chargers VALUES (%s, %s) ON CONFLICT DO NOTHING",
                   (ledger, CHARGER), db=db, user=OWNER)


def team(pg: tuple, label: str | None = None) -> tuple[str, str]:
    """A new ledger (ε=3, δ=1e-5) of the ``pg`` fixture's database that the test charging role
    may charge, charged once by it (the fix row and one run, under ``label``): its owner's
    and its charging role's URLs."""
    from privguard import Ledger
    from privguard import mechanisms as M

    srv, db, name = pg
    Ledger(3.0, 1e-5, path=srv.url(OWNER, db, name)).close()
    allow_charger(db, name)
    job = Ledger(3.0, 1e-5, path=srv.url(CHARGER, db, name))
    job.charge(M.SubsampledGaussian(1.0, 0.01), label=label)
    job.close()
    return srv.url(OWNER, db, name), srv.url(CHARGER, db, name)


def server() -> Server:
    """The process's server, started on first use; PGPASSFILE points at its passwords."""
    global _SERVER
    if _SERVER is None:
        bindir = binaries()
        if bindir is None:
            raise RuntimeError(SKIP_REASON)
        started = time.perf_counter()
        _SERVER = Server(bindir)
        atexit.register(stop)
        os.environ["PGPASSFILE"] = _SERVER.passfile
        _SERVER.startup_seconds = time.perf_counter() - started  # type: ignore[attr-defined]
    return _SERVER


def stop() -> None:
    """Shut the server down and remove its directory (idempotent)."""
    global _SERVER, _DATABASE
    _DATABASE = None
    if _SERVER is not None:
        srv, _SERVER = _SERVER, None
        srv.destroy()
