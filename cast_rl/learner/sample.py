"""The learner's unit of data, :class:`~cast_rl.samples.Sample`: it lives in :mod:`cast_rl.samples`
(below every subpackage, torch-free, so the replay buffer reads samples without importing the
learner); these names stay importable from here."""

from __future__ import annotations

from cast_rl.samples import LOGPROB_MODES, SOURCES, LogprobMode, Origin, Sample

__all__ = ["LOGPROB_MODES", "SOURCES", "LogprobMode", "Origin", "Sample"]
