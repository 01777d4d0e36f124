"""``make setup``'s installer (launchers/install.py): uv with pip's own settings.

A machine's package settings live in pip's configuration (a mirror index, local wheels, a
constraints file, a CA bundle), which uv does not read: these check that each reaches uv's
command line, with pip's precedence, and that the Makefile installs through it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import launchers.install as install
from launchers.install import SECTIONS, UV, command, pip_settings, uv_options

REPO = Path(__file__).resolve().parents[1]

PIP_CONFIG_LIST = """\
global.constraint='/etc/pip/constraints.txt'
global.cert='/etc/ssl/certs/ca.crt'
global.find-links='/srv/wheels'
global.extra-index-url='file:///srv/pypi/simple file:///srv/more/simple'
install.trusted-host='mirror.internal'
:env:.default-timeout='180'
:env:.find-links='/srv/local-wheels'
:env:.disable-pip-version-check='1'
"""
"""``pip config list`` as pip prints it: files first, then the PIP_* variables (the last wins)."""


def _values(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == flag]


def test_pip_settings_take_the_last_setting_of_each_option() -> None:
    settings = pip_settings(PIP_CONFIG_LIST.splitlines())
    assert settings["find-links"] == "/srv/local-wheels"  # PIP_FIND_LINKS over the file
    assert settings["extra-index-url"] == "file:///srv/pypi/simple file:///srv/more/simple"
    assert settings["trusted-host"] == "mirror.internal"
    assert settings["default-timeout"] == "180"


def test_pip_settings_skip_sections_pip_install_does_not_read() -> None:
    settings = pip_settings(["freeze.find-links='/nowhere'", "not a setting", "global.index-url=https://m/simple"])
    assert settings == {"index-url": "https://m/simple"}


def test_every_index_wheel_folder_and_constraint_reaches_uv() -> None:
    cmd, env = command(["torch==2.13.0", "-e", ".[cpu,dev]"], pip_settings(PIP_CONFIG_LIST.splitlines()),
                       python="/venv/bin/python")
    assert cmd[:4] == ["/venv/bin/python", "-m", "uv", "pip"] and cmd[4] == "install"
    assert _values(cmd, "--python") == ["/venv/bin/python"]  # into that environment, not uv's own
    assert _values(cmd, "--extra-index-url") == ["file:///srv/pypi/simple", "file:///srv/more/simple"]
    assert _values(cmd, "--find-links") == ["/srv/local-wheels"]
    assert _values(cmd, "--constraint") == ["/etc/pip/constraints.txt"]
    assert _values(cmd, "--allow-insecure-host") == ["mirror.internal"]
    assert _values(cmd, "--index-strategy") == ["unsafe-best-match"]  # pip's best version over all indexes
    assert "--compile-bytecode" in cmd  # as pip does: the first import compiles nothing
    assert cmd[-3:] == ["torch==2.13.0", "-e", ".[cpu,dev]"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca.crt", "UV_HTTP_TIMEOUT": "180"}


def test_an_index_url_and_no_index_reach_uv() -> None:
    options, env = uv_options({"index-url": "https://mirror/simple", "no-index": "true"})
    assert _values(options, "--index-url") == ["https://mirror/simple"] and "--no-index" in options
    assert env == {}


def test_uninstall_passes_the_names_only() -> None:
    cmd, env = command(["--uninstall", "torchvision", "torchaudio"], {"find-links": "/w"}, python="/p")
    assert cmd == ["/p", "-m", "uv", "pip", "uninstall", "--quiet", "--python", "/p", "torchvision", "torchaudio"]
    assert env == {}


def test_this_machines_pip_settings_parse() -> None:
    """The real ``pip config list`` of this interpreter: every line it prints is a setting or skipped."""
    import subprocess

    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    settings = pip_settings(listed)
    read = {key.rpartition(".")[2] for key, _, _ in (line.partition("=") for line in listed)
            if key.rpartition(".")[0] in SECTIONS}
    assert set(settings) == read, (settings, listed)
    assert all(not v.startswith(("'", '"')) for v in settings.values()), settings


def test_the_makefile_installs_through_it() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert "INSTALL := $(BIN)/python -m launchers.install" in makefile
    assert "uv==" not in recipe  # one pin: launchers.install.UV, installed on first use
    for step in ("$(INSTALL) torch==", "$(INSTALL) --uninstall torchvision torchaudio torchcodec",
                 "$(INSTALL) --no-deps verl=="):
        assert step in recipe, step
    assert "pip install --quiet torch" not in recipe  # no second, slower install beside it


def test_gpu_check_installs_through_it() -> None:
    """`make gpu-check` installs the GPU extra as `make setup` installs the CPU one: a device's
    minutes are counted, and pip took more than twice uv's time on the CPU stack."""
    script = (REPO / "bench" / "gpu_check.sh").read_text()
    assert """"$PY" -m launchers.install -e '.[gpu,dev]'""" in script
    assert "pip install" not in script


def test_uv_is_installed_with_pip_only_when_missing(monkeypatch) -> None:  # noqa: ANN001
    """The first install of a fresh virtual environment brings the pinned uv in with pip; a later
    one finds it and runs no pip."""
    import importlib.util

    calls: list[list[str]] = []
    monkeypatch.setattr(install.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    install.ensure_uv()
    assert calls == [[sys.executable, "-m", "pip", "install", "--quiet", UV]]
    assert re.fullmatch(r"uv==\d+\.\d+\.\d+", UV)
    calls.clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    install.ensure_uv()
    assert calls == []
