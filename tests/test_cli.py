"""The ``cast-rl`` console script lists its subcommands."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cast_rl.cli import build_parser


def test_help_lists_subcommands() -> None:
    exe = shutil.which("cast-rl") or sys.executable
    cmd = [exe, "--help"] if exe != sys.executable else [exe, "-m", "cast_rl.cli", "--help"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for name in ("config", "model", "env"):
        assert name in out


def test_make_tiny_cli(tmp_path) -> None:
    from cast_rl.cli import main

    assert main(["model", "make-tiny", str(tmp_path / "m"), "policy.seed=3", "policy.tiny.vocab_size=512"]) == 0
    assert (tmp_path / "m" / "config.json").exists()
    assert (tmp_path / "m" / "tokenizer.json").exists()
    # policy.tiny.vocab_size=512 reached the builder (the default is 4096): BPE + a few markup tokens
    assert json.loads((tmp_path / "m" / "config.json").read_text())["vocab_size"] < 1000


# Every subcommand that reads configuration takes [CONFIG] [key=value ...] through
# cast_rl.config.args; the keys below were flags of label, env and critic before.
CONFIGURED = {
    "config show": ["config", "show"],
    "model make-tiny": ["model", "make-tiny", "out"],
    "env generate": ["env", "generate", "--out", "o"],
    "env replay": ["env", "replay", "--out", "o"],
    "rollout": ["rollout", "--out", "o"],
    "label": ["label", "--trajectories", "t", "--out", "o"],
    "blame": ["blame", "--trajectories", "t", "--labels", "l", "--out", "o"],
    "benefit": ["benefit", "--out", "o"],
    "critic build-data": ["critic", "build-data", "--labels", "l", "--trajectories", "t", "--out", "o"],
    "critic eval": ["critic", "eval", "--data", "d"],
    "eval": ["eval"],
    "pipeline": ["pipeline"],
    "train": ["train"],
}


def _with_overrides(argv: list[str], overrides: list[str]) -> list[str]:
    """Overrides go right after the subcommand's own positionals (before its flags)."""
    flags = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
    return [*argv[:flags], *overrides, *argv[flags:]]


@pytest.mark.parametrize("name", sorted(CONFIGURED))
def test_every_subcommand_reads_config_and_overrides(name: str, tmp_path) -> None:
    from cast_rl.config.args import config_from_args

    yaml = tmp_path / "c.yaml"
    yaml.write_text("env:\n  domain: telecom\n  now: '2024-05-15T15:00:00'\nlogging:\n  mode: disabled\n")
    parser = build_parser()
    # CONFIG left out: the first argument is already an override
    cfg = config_from_args(parser.parse_args(_with_overrides(CONFIGURED[name], ["env.domain=airline"])))
    assert (cfg.env.domain, cfg.env.now) == ("airline", "")
    # a YAML file, then overrides on top of it
    cfg = config_from_args(
        parser.parse_args(_with_overrides(CONFIGURED[name], [str(yaml), "env.data_dir=/d", "logging.mode=offline"]))
    )
    assert (cfg.env.domain, cfg.env.now, cfg.env.data_dir, cfg.logging.mode) == (
        "telecom", "2024-05-15T15:00:00", "/d", "offline"
    )


def test_a_bad_key_is_named_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from cast_rl.cli import main

    assert main(["label", "env.domian=retail", "--trajectories", "t", "--out", "o"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'env.domian'" in err and "domain" in err and len(err.strip().splitlines()) == 1
    assert main(["env", "replay", "env.domain=moon", "--out", "o"]) == 2
    assert "env.domain='moon' is not allowed; choose one of retail, airline, telecom, telehealth" in (
        capsys.readouterr().err
    )


def test_launchers_share_the_helper(capsys: pytest.CaptureFixture[str]) -> None:
    """A launcher's config error exits 2 with the same one line as ``cast-rl``'s, before anything
    starts: ``python -m launchers.X`` and ``cast-rl X`` run one command (launchers.commands)."""
    from cast_rl.cli import main as cast_rl_main
    from launchers import eval as eval_launcher
    from launchers import pipeline, rollout, train

    for name, main, extra in (("rollout", rollout.main, ["--out", "o"]), ("eval", eval_launcher.main, []),
                              ("pipeline", pipeline.main, []), ("train", train.main, [])):
        assert main(["default", "rollout.num_wokers=2", *extra]) == 2
        err = capsys.readouterr().err
        assert "unknown key 'rollout.num_wokers'" in err and len(err.strip().splitlines()) == 1
        assert cast_rl_main([name, "default", "rollout.num_wokers=2", *extra]) == 2
        assert capsys.readouterr().err == err


def test_the_domain_list_is_written_once() -> None:
    """Config validation and the environment registry read one list (config.schema.DOMAIN_NAMES)."""
    from cast_rl.config.schema import DOMAIN_NAMES
    from cast_rl.envs.domain import get_domain

    assert [get_domain(name).name for name in DOMAIN_NAMES] == list(DOMAIN_NAMES)
    repo = Path(__file__).resolve().parents[1]
    sources = [p for part in ("cast_rl", "actors", "launchers") for p in (repo / part).rglob("*.py")]
    copies = [p.relative_to(repo) for p in sources if '"retail", "airline", "telecom", "telehealth"' in p.read_text()]
    assert copies == [Path("cast_rl/config/env.py")]


def test_log_level_flag_is_the_logging_level_key() -> None:
    """The one convenience flag kept is mapped onto its key in the helper (FLAG_KEYS)."""
    import logging

    from cast_rl.config.args import config_from_args

    parser = build_parser()
    root = logging.getLogger()
    before = root.level
    try:
        cfg = config_from_args(parser.parse_args(["--log-level", "debug", "config", "show", "logging.level=ERROR"]))
        assert cfg.logging.level == "DEBUG" and root.level == logging.DEBUG  # the flag wins
        cfg = config_from_args(parser.parse_args(["config", "show", "logging.level=WARNING"]))
        assert cfg.logging.level == "WARNING" and root.level == logging.WARNING  # the key is read
    finally:
        root.setLevel(before)
