"""``python -m privguard``: the ``privguard`` command."""

import sys

from privguard._cli._cli import main

if __name__ == "__main__":
    sys.exit(main())
