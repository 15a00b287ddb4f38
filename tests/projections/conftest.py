"""Make ``projections`` the package, not this test folder of the same name.

``tests/`` is on ``sys.path`` (pytest's rootdir conftest), so without the repo
root in front, ``import projections`` could resolve to ``tests/projections``
as a namespace package when pytest is run as ``.venv/bin/pytest``.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
