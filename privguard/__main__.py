"""``python -m privguard``: the ``privguard`` command."""

import sys

from privguard._cli import main

sys.exit(main())
