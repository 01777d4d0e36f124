"""A static trajectory viewer: every episode of a run with its critiques, labels and outcome.

``cast-rl view RUN_OR_EVAL_DIR [--out DIR]``; see :mod:`cast_rl.viewer.site` for the pages and
:mod:`cast_rl.viewer.sources` for the directories it reads.
"""

from cast_rl.viewer.site import build_viewer

__all__ = ["build_viewer"]
