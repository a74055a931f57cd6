"""The warnings a small Lightning fit under Opacus prints that no test is about.

``pytestmark = QUIET`` in a test module; a test about one of these warnings
asserts it with ``pytest.warns`` (which sees it whatever the filters say).
"""

from __future__ import annotations

import pytest

QUIET = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                   "ignore:.*does not have many workers.*",
                                   "ignore:.*no logger configured.*",
                                   "ignore:.*Full backward hook.*",
                                   "ignore:.*accountant is.*")
