"""The ``privguard`` command: report on and plot a ledger file, run the demo.

    privguard report budget.db [--json]
    privguard plot budget.db -o eps.png
    privguard demo [--db PATH] [--quick]

Exit status: 0 on success, 2 when the ledger cannot be read (it fails
closed: an inconsistent file is reported, never repaired), 1 on other errors.
"""

from __future__ import annotations

import argparse
import json
import sys

from privguard._errors import PrivguardError
from privguard._ledger import Ledger
from privguard._report import plot, print_report, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="privguard", description="Inspect privguard ledgers.")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="targets, running ε, remaining budget, charges, timeline")
    rep.add_argument("path")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    plo = sub.add_parser("plot", help="PNG of ε over charges")
    plo.add_argument("path")
    plo.add_argument("-o", "--output", required=True)
    demo = sub.add_parser("demo", help="tune, train and report a private model (the main job)")
    demo.add_argument("--db", default=None, help="ledger file (default: a new one under "
                      "./privguard-demo/)")
    demo.add_argument("--quick", action="store_true", default=None,
                      help="reduced size (the default when CI=true)")
    demo.add_argument("--epsilon", type=float, default=10.0, help="total budget")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from privguard._demo import run

            run(db=args.db, quick=args.quick, epsilon=args.epsilon)
            return 0
        ledger = Ledger.open(args.path)
        if args.command == "report":
            data = report(ledger)
            if args.json:
                json.dump(data, sys.stdout, indent=2, default=str)
                print()
            else:
                print_report(data)
        else:
            print(plot(ledger, args.output))
    except PrivguardError as exc:
        print(f"privguard: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"privguard: error: {exc!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
