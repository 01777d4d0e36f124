"""The layers hold: the import contract of ``make lint`` passes here and fails on planted violations.

Layers, lowest first: the library ``cast_rl`` (all but ``cast_rl.cli``) < ``actors`` < ``launchers``
< ``cast_rl.cli``; the library imports no Ray; no import cycles inside ``cast_rl`` (the contracts
are ``[tool.importlinter]`` in pyproject.toml).  Each planted violation is written into a copy of
the three packages, so the checker runs on exactly the tree it would see in a commit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("cast_rl", "actors", "launchers")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=root, capture_output=True, text=True,
        env={"PYTHONPATH": str(root), "PATH": str(LINT_IMPORTS.parent)}, timeout=120,
    )


def _layers(root: Path) -> dict:
    """The figures ``bench/import_layers.py`` prints (its last line) for the tree under ``root``."""
    result = subprocess.run([sys.executable, str(REPO / "bench" / "import_layers.py"), "--root", str(root)],
                            capture_output=True, text=True, timeout=120, cwd=root, env={"PYTHONPATH": str(root)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the packages' tracked files and pyproject.toml (the contracts) to plant violations in."""
    root = tmp_path_factory.mktemp("layers")
    tracked = subprocess.run(["git", "ls-files", "--", *PACKAGES, "pyproject.toml"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
    for path in tracked:
        if (REPO / path).exists():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / path, root / path)
    return root


def test_the_import_contracts_hold_and_the_layer_listing_shows_no_upward_edge_nor_cycle() -> None:
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and "4 kept, 0 broken" in result.stdout
    figures = _layers(REPO)
    assert figures["upward_any_level"] == 0
    assert figures["module_cycles_any_level"] == []


PLANTS = {
    # a library module reaching for Ray inside a function (any level counts)
    "library imports ray": (
        {"cast_rl/learner/planted.py": "def f():\n    import ray\n\n    return ray\n"},
        "The library (cast_rl but cast_rl.cli) imports neither ray",
    ),
    "library imports actors": (
        {"cast_rl/rollout/planted.py": "from actors.rollout_group import RolloutGroup\n"},
        "The library (cast_rl but cast_rl.cli) imports neither ray",
    ),
    "actors import launchers": (
        {"actors/planted.py": "from launchers.train import train_policy\n"},
        "Layers: launchers > actors",
    ),
    "launchers import the CLI": (
        {"launchers/planted.py": "from cast_rl.cli import main\n"},
        "Nothing below the CLI imports cast_rl.cli",
    ),
    "a module cycle": (
        {"cast_rl/eval/planted_a.py": "from cast_rl.eval import planted_b\n",
         "cast_rl/eval/planted_b.py": "def f():\n    from cast_rl.eval import planted_a\n\n    return planted_a\n"},
        "No import cycles",
    ),
}


@pytest.mark.parametrize("name", PLANTS)
def test_a_planted_violation_breaks_the_contract(name: str, tree: Path) -> None:
    files, broken = PLANTS[name]
    for path, text in files.items():
        (tree / path).write_text(text)
    try:
        result = _lint(tree)
        figures = _layers(tree)
    finally:
        for path in files:
            (tree / path).unlink()
    assert result.returncode == 1, result.stdout + result.stderr
    report = result.stdout[result.stdout.index("Broken contracts"):]
    assert broken in report and "planted" in report
    # the listing of bench/import_layers.py sees the same violation
    if name == "a module cycle":
        assert figures["module_cycles_any_level"] == [["cast_rl.eval.planted_a", "cast_rl.eval.planted_b"]]
    else:
        assert figures["upward_any_level"] == 1


