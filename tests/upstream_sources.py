"""The upstream sources the differential fuzz tests compare against, found by environment variable.

``CAST_RL_TAU_BENCH_SRC`` (sierra-research/tau-bench) and ``CAST_RL_TAU_TRAIT_SRC``
(collinear-ai/tau-trait) each name a git repository (bare, or a checkout with ``.git``) or a plain
source tree.  Unset, the tests that need them skip and say which variable to set.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

TAU_BENCH_ENV = "CAST_RL_TAU_BENCH_SRC"
TAU_TRAIT_ENV = "CAST_RL_TAU_TRAIT_SRC"


def upstream_root(env_var: str) -> Path | None:
    """The directory ``env_var`` names, or None when it is unset or empty."""
    value = os.environ.get(env_var, "")
    return Path(value) if value else None


def skip_reason(env_var: str) -> str:
    root = upstream_root(env_var)
    if root is None:
        return f"set {env_var} to a clone of the upstream repository to run the tests that compare with its source"
    return f"{env_var}={root} is not a directory"


def extract(env_var: str, paths: tuple[str, ...], dest: Path) -> Path | None:
    """Copies ``paths`` of the upstream tree into ``dest`` (from git's HEAD when it is a repository,
    so a checkout's local edits do not count); None when the variable names nothing usable."""
    root = upstream_root(env_var)
    if root is None or not root.is_dir():
        return None
    is_git = (root / "HEAD").exists() or (root / ".git").exists()
    if is_git:
        archive = subprocess.run(["git", "-C", str(root), "archive", "HEAD", *paths],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return dest
    for rel in paths:
        src, out = root / rel, dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, out)
        else:
            shutil.copy2(src, out)
    return dest


def require(env_var: str, paths: tuple[str, ...], dest: Path) -> Path:
    """:func:`extract`, skipping the test with the variable's name when it gives nothing."""
    root = extract(env_var, paths, dest)
    if root is None:
        pytest.skip(skip_reason(env_var))
    return root
