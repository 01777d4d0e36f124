"""Where a run's episodes are: trajectory files, their configuration names and their labels.

:func:`discover` accepts three kinds of directory:

* an evaluation directory (what ``cast-rl eval --out DIR`` writes): ``trajectories/<name>.jsonl``,
  one file per configuration (``no_critic``, ``critic_b1``, ...);
* a pipeline run directory (``cast-rl pipeline``): ``01_eval_before/trajectories/``,
  ``02_collect/trajectories.jsonl`` (labelled by ``03_label/labels.jsonl``),
  ``06_collect_with_critic/trajectories.jsonl`` and ``08_eval_after/trajectories/``;
* any directory holding a ``trajectories.jsonl`` (a ``labels.jsonl`` beside it labels it).

Lines are read as plain JSON objects, not through :class:`~cast_rl.records.Trajectory`,
so files written before or after a format change (new optional keys) still open; every field is
read with a default.  A line that is not a JSON object is an error naming the file and the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cast_rl.config.schema import STAGE_DIRS
from cast_rl.jsonl import iter_jsonl


class ViewerInputError(ValueError):
    """A run directory or file the viewer cannot read; the message names it."""


@dataclass(frozen=True)
class Source:
    """One trajectory file and what it is."""

    key: str
    """Short unique name used in episode ids (``eval_before-no_critic``, ``collect``, ...)."""
    configuration: str
    """What the index shows (``before: no critic``, ``collect``, ``critic B=1``, ...)."""
    trajectories: Path
    labels: Path | None = None
    """Labels whose ``trajectory_index`` counts this file's trajectories in order."""


def configuration_label(name: str) -> str:
    """``no_critic`` -> ``no critic``, ``critic_b2`` -> ``critic B=2`` (as the report names them)."""
    if name == "no_critic":
        return "no critic"
    match = re.fullmatch(r"critic_b(\d+)", name)
    return f"critic B={match.group(1)}" if match else name


def _stage(root: Path, stage: str) -> Path:
    return root / STAGE_DIRS[stage]


def _eval_sources(directory: Path, prefix: str = "", tag: str = "") -> list[Source]:
    return [
        Source(f"{prefix}{path.stem}", f"{tag}{configuration_label(path.stem)}", path)
        for path in sorted((directory / "trajectories").glob("*.jsonl"))
    ]


def discover(root: str | Path) -> list[Source]:
    """The trajectory files of an evaluation, pipeline or collection directory (module docstring)."""
    root = Path(root)
    if not root.is_dir():
        raise ViewerInputError(f"{root} is not a directory")
    sources: list[Source] = []
    if (root / "trajectories").is_dir():
        sources += _eval_sources(root)
    for stage, tag in (("eval_before", "before: "), ("eval_after", "after: ")):
        sources += _eval_sources(_stage(root, stage), f"{stage}-", tag)
    for stage, labels_stage in (("collect", "label"), ("collect_with_critic", None)):
        path = _stage(root, stage) / "trajectories.jsonl"
        if path.is_file():
            labels = _stage(root, labels_stage) / "labels.jsonl" if labels_stage else None
            sources.append(Source(stage, stage.replace("_", " "), path,
                                  labels if labels is not None and labels.is_file() else None))
    if not sources and (root / "trajectories.jsonl").is_file():
        labels = root / "labels.jsonl"
        sources.append(Source(root.name or "run", root.name or "trajectories", root / "trajectories.jsonl",
                              labels if labels.is_file() else None))
    if not sources:
        raise ViewerInputError(
            f"no trajectories found in {root}: expected an evaluation directory (trajectories/*.jsonl), "
            "a pipeline run directory (01_eval_before/, 02_collect/, ...) or a trajectories.jsonl"
        )
    return sources


def read_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of a JSON Lines file, blank lines skipped."""
    for lineno, obj in iter_jsonl(path, error=ViewerInputError):
        if not isinstance(obj, dict):
            raise ViewerInputError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def read_labels(path: Path | None) -> dict[int, list[dict[str, Any]]]:
    """trajectory_index -> its labels (``cast-rl label`` lines), in file order."""
    out: dict[int, list[dict[str, Any]]] = {}
    if path is None:
        return out
    for lineno, obj in read_records(path):
        index = obj.get("trajectory_index")
        if not isinstance(index, int) or not isinstance(obj.get("message_index"), int):
            raise ViewerInputError(f"{path}:{lineno}: a label needs integer trajectory_index and message_index")
        out.setdefault(index, []).append(obj)
    return out
