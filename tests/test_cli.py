"""The ``cast-rl`` console script lists its subcommands."""

from __future__ import annotations

import shutil
import subprocess
import sys

from cast_rl.cli import build_parser


def test_help_lists_subcommands() -> None:
    exe = shutil.which("cast-rl") or sys.executable
    cmd = [exe, "--help"] if exe != sys.executable else [exe, "-m", "cast_rl.cli", "--help"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for name in ("config", "model", "env"):
        assert name in out


def test_make_tiny_cli(tmp_path) -> None:
    from cast_rl.cli import main

    assert main(["model", "make-tiny", str(tmp_path / "m"), "--seed", "3", "--vocab-size", "512"]) == 0
    assert (tmp_path / "m" / "config.json").exists()
    assert (tmp_path / "m" / "tokenizer.json").exists()
    assert build_parser().parse_args(["model", "make-tiny", "x"]).seed == 0
