"""``python -m cast_rl.cli`` is the same as ``cast-rl``."""

import sys

from cast_rl.cli import main

sys.exit(main())
