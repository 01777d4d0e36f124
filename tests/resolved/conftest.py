"""Fixtures of tests/resolved: the checks named by resolved issues, each run as CI runs it.

``chromium`` is the viewer tests' fixture (Debian's package, installed with apt-get when missing),
shared rather than copied.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "viewer"))
from test_viewer_browser import chromium  # noqa: E402, F401
