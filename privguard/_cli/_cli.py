"""The ``privguard`` command: inspect, verify and upgrade ledger files; run the demo.

    privguard report budget.db [--json] [--compare-prv]
    privguard plot budget.db -o eps.png [--no-prv]
    privguard verify budget.db
    privguard upgrade budget.db --epsilon E --delta D
    privguard server-init postgresql://admin@host/db --ledger NAME --epsilon E --delta D
    privguard server-upgrade postgresql://admin@host/db
    privguard demo [--db PATH] [--quick] [--epsilon E]
    privguard audit [--quick] [--seed N] [--steps N] [--canaries N]

Each PATH may also be a ``postgresql://USER@HOST:PORT/DB?ledger=NAME`` URL
(``pip install 'privguard[postgres]'``); ``server-init`` creates the schema,
an owner and a charging role there, and the ledger; ``server-upgrade`` brings a
schema an older privguard created to this privguard's version (an explicit step: no
open upgrades a schema, and older clients refuse an upgraded one).

``upgrade`` converts a privguard 0.1 file. Nothing in a 0.1 file protects its
target, so you restate the target you set and it must equal the file's:
``--epsilon E --delta D``; ``--delta D`` alone for a ledger without an ε
target; ``--rdp-budget V1,V2,...`` (and ``--delta D`` if it had one) for a
strict per-order budget; ``--no-target`` for neither. Without them it refuses
and shows the target the file claims and the command that confirms it.

``report``, ``plot`` and ``verify`` open the file read-only. A path that is
not a regular file (a FIFO, a directory, a device) is refused before it is
opened, and ``plot`` checks its output path before computing (``-o`` names the image
file; a directory is refused, naming a file inside it). Exit status: 0
on success, 2 on a bad argument or when the ledger cannot be read or fails
verification (it fails closed: an inconsistent file is reported, never repaired),
130 on Ctrl-C (one line, no traceback), 1 on other errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from privguard._errors import PrivguardError
from privguard._ledger._ledger import Ledger


def _floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers"
                                         ) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privguard",
                                     description="Inspect, verify and upgrade privguard ledgers.")
    from privguard import __version__

    parser.add_argument("--version", action="version", version=f"privguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="targets, running ε, remaining budget, charges, timeline")
    rep.add_argument("path")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.add_argument("--compare-prv", action="store_true",
                     help="also show Opacus' PRV ε for the same sequence (loads torch)")
    plo = sub.add_parser("plot", help="PNG of ε over charges")
    plo.add_argument("path")
    plo.add_argument("-o", "--output", required=True)
    plo.add_argument("--no-prv", action="store_true", help="leave out Opacus' PRV line")
    ver = sub.add_parser("verify", help="replay and check the whole journal; non-zero exit "
                         "on any inconsistency")
    ver.add_argument("path")
    upg = sub.add_parser("upgrade", help="upgrade a privguard 0.1 file (verified first; "
                         "logged; the original is kept as PATH.v1); restate its target",
                         description="Upgrade a privguard 0.1 ledger file. A 0.1 file does "
                         "not protect its target, so restate the target you set; it must "
                         "equal the file's exactly. Without it, the command refuses and "
                         "shows the target the file claims.")
    upg.add_argument("path")
    upg.add_argument("--epsilon", type=float, help="the target ε you set")
    upg.add_argument("--delta", type=float, help="the δ you set (also for a ledger without "
                     "an ε target)")
    upg.add_argument("--rdp-budget", type=_floats, metavar="V1,V2,...",
                     help="a strict ledger's per-order RDP budget, one value per order")
    upg.add_argument("--no-target", action="store_true",
                     help="the ledger had neither a target nor a δ")
    ini = sub.add_parser("server-init", help="create the privguard schema, an owner and a "
                         "charging role, and a ledger in PostgreSQL (run as a role that may "
                         "create roles, e.g. a superuser)")
    ini.add_argument("url", help="postgresql://USER@HOST:PORT/DB")
    ini.add_argument("--ledger", required=True, help="the ledger's name")
    ini.add_argument("--epsilon", type=float, required=True, help="target ε")
    ini.add_argument("--delta", type=float, required=True, help="target δ")
    ini.add_argument("--charger", default="privguard_charger",
                     help="the charging role (created if missing; default privguard_charger)")
    ini.add_argument("--owner", default="privguard_owner",
                     help="the owner role (created if missing; default privguard_owner)")
    upg2 = sub.add_parser("server-upgrade", help="upgrade the privguard schema of a PostgreSQL "
                          "database to this privguard's version (run as the schema's owner or "
                          "a superuser; older privguard clients then refuse the database)")
    upg2.add_argument("url", help="postgresql://USER@HOST:PORT/DB")
    demo = sub.add_parser("demo", help="tune, train and report a private model (the main job)")
    demo.add_argument("--db", default=None, help="ledger file (default: a new one under "
                      "./privguard-demo/)")
    demo.add_argument("--quick", action="store_true", default=None,
                      help="reduced size (the default when CI=true)")
    demo.add_argument("--epsilon", type=float, default=10.0, help="total budget")
    aud = sub.add_parser("audit", help="one-run audit of the demo's pipeline: the empirical "
                         "lower bound on ε beside the charged ε")
    aud.add_argument("--quick", action="store_true", help="100 steps, 1,000 canaries")
    aud.add_argument("--seed", type=int, default=None, help="seed the canaries (reproducible)")
    aud.add_argument("--steps", type=int, default=None, help="real steps (default 600; 100 "
                     "with --quick)")
    aud.add_argument("--canaries", type=int, default=None, help="canaries (default 2000; 1000 "
                     "with --quick)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "audit":
            from privguard._accounting._results import exact, lower, upper
            from privguard.audit import demo_audit

            res = demo_audit(quick=args.quick, seed=args.seed, steps=args.steps,
                             canaries=args.canaries)
            print(f"one-run audit, {res.steps} steps, {res.canaries} canaries: {res.correct} of "
                  f"{res.guesses} guesses right (the best of {res.guess_sets} guess sets fixed "
                  f"in advance, the confidence split between them)\n"
                  # a lower bound: rounded down, as an upper one is rounded up (review lo2)
                  f"  epsilon_lower   = {lower(res.epsilon_lower, '.3f')}  (true ε at δ = "
                  f"{exact(res.delta)} is "
                  f"at least this with {res.confidence:.0%} confidence)\n"
                  f"  epsilon_charged = {upper(res.epsilon_charged, '.3f')}  (the run is (ε, δ)-DP at this ε: "
                  f"the ledger's charges, steps fixed in advance)\n"
                  # lower / upper: a lower bound on the share of the charge the run is shown
                  # to use, rounded down too (review aud: 0.9996 read "1.000")
                  f"  ratio           = {lower(res.ratio, '.3f')}")
        elif args.command == "demo":
            from privguard._cli._demo import run

            run(db=args.db, quick=args.quick, epsilon=args.epsilon)
        elif args.command == "upgrade":
            from privguard._stores._migrate import upgrade

            print(json.dumps(upgrade(args.path, args.epsilon, args.delta,
                                     rdp_budget=args.rdp_budget, no_target=args.no_target),
                             indent=2))
        elif args.command == "server-init":
            from privguard._accounting._results import exact
            from privguard._stores._pgadmin import server_init
            from privguard._stores._pgschema import SCHEMA_VERSION

            done = server_init(args.url, args.ledger, args.epsilon, args.delta,
                               charger=args.charger, owner=args.owner)
            # exact, so the Ledger(...) line shown is not refused as another configuration (review
            # cli: --epsilon 1.23456789 printed Ledger(1.23457, ...))
            eps, delta = (exact(x) for x in done["target"])
            print(f"ledger {done['ledger']!r}: target (ε = {eps}, δ = {delta}), "
                  f"{done['charges']} charges so far; schema owner {done['schema_owner']!r}, "
                  f"charging role {done['charger']!r}.\n"
                  + (f"The privguard schema is version {done['schema_version']}, an older "
                     "privguard's, used as it is; `privguard server-upgrade` upgrades it "
                     "(then older clients refuse the database).\n"
                     if done["schema_version"] != SCHEMA_VERSION else "") +
                  f"Jobs charge it with Ledger({eps}, {delta}, path={done['charger_url']!r})")
        elif args.command == "server-upgrade":
            from privguard._stores._pgadmin import server_upgrade

            done = server_upgrade(args.url)
            print(f"privguard schema (owner {done['schema_owner']!r}): "
                  + (f"already version {done['to']}" if done["from"] == done["to"] else
                     f"upgraded from version {done['from']} to {done['to']}; privguard clients "
                     "older than this one now refuse this database"))
        elif args.command == "verify":
            from privguard._stores import open_store
            from privguard._stores._snapshot import snapshot

            with snapshot(args.path):  # read still, nothing written beside it (_snapshot.py)
                store = open_store(args.path, read_only=True)
                try:
                    store.open(None, None, None)
                    result = store.verify()
                finally:
                    store.close()
            print(f"{store.path}: OK — {result['rows']} journal rows ({result['charges']} "
                  f"charges in {result['runs']} runs, {result['checkpoints']} checkpoints) "
                  f"replayed and verified in {result['seconds']:.3f} s "
                  f"({result['rows_per_second']:,.0f} rows/s)"
                  f"{'; keyed' if result['keyed'] else ''}")
        else:
            from privguard._cli._report import json_ready, plot, print_report, report
            from privguard._stores._snapshot import snapshot

            with snapshot(args.path):  # read still, nothing written beside it (_snapshot.py)
                ledger = Ledger.open(args.path, read_only=True)
                try:
                    if args.command == "report":
                        data = report(ledger, compare_prv=args.compare_prv)
                    else:
                        drawn = plot(ledger, args.output, compare_prv=not args.no_prv)
                finally:
                    ledger.close()
            if args.command != "report":
                print(drawn)
            elif args.json:
                json.dump(json_ready(data), sys.stdout, indent=2, default=str, allow_nan=False)
                print()
            else:
                print_report(data)
    except PrivguardError as exc:
        print(f"privguard: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `privguard report FILE | head`: the reader left, as for any CLI
        # Python flushes stdout again at exit; point it at devnull so that raises nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by the pipe
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (review cli); the charges
        # already made stay in the ledger (a ledger never goes backwards), nothing is undone
        print("privguard: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C
    except OSError as exc:  # e.g. the output cannot be written (`> /dev/full`): one line,
        # as for any command, not a built-in exception's repr (review cli)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"privguard: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line, the message as written, not its repr (review lo2);
        # a message of several lines joined (review rlo2: it printed as several)
        text = " ".join(str(exc).split())
        print(f"privguard: error: {type(exc).__name__}" + (f": {text}" if text else ""),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
