"""``make setup``'s installer: ``uv pip install`` into this interpreter's environment, with pip's settings.

uv installs the same packages as pip in less than half the time (a fresh ``.venv``, cold caches,
bytecode compiled: 42 s against 99 s on a 2-core machine, 2026-12-07), but it reads none of pip's
configuration.  A machine's package settings live there (pip.conf files and ``PIP_*`` variables: a
mirror index, a folder of local wheels, a constraints file, a CA bundle), so this passes them on as
uv's own options; ``pip config list`` is where they are read, as pip itself would apply them (a
variable over a file, a later file over an earlier one).  pip's way of choosing among several
indexes (the best version from any of them) is uv's ``--index-strategy unsafe-best-match``.

    python -m launchers.install torch==2.13.0 -e '.[cpu,dev]'
    python -m launchers.install --no-deps verl==0.9.1
    python -m launchers.install --uninstall torchvision torchaudio torchcodec

Standard library only: it runs before anything is installed.  uv itself (:data:`UV`, pinned) is
installed into the interpreter by pip on first use, so ``make setup`` and ``make gpu-check`` share
one pin.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence

UV = "uv==0.13.9"
"""The uv every install runs (pip installs it into the interpreter when it is missing)."""

SECTIONS = ("global", "install", ":env:")
"""pip's sections that apply to ``pip install`` (``:env:`` is the ``PIP_*`` variables)."""

LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint",
                "trusted-host": "--allow-insecure-host"}
"""pip options whose value is a whitespace-separated list -> uv's option, once per item."""


def pip_settings(lines: Iterable[str]) -> dict[str, str]:
    """Option -> value from ``pip config list`` lines (``global.find-links='/opt/wheels'``), the last
    setting of an option winning, as pip lists its files and variables in the order it applies them."""
    settings: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.strip().partition("=")
        section, _, option = key.rpartition(".")
        if not sep or section not in SECTIONS or not option:
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        settings[option] = value
    return settings


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment for pip's settings; a setting uv has no counterpart for is left out."""
    options = ["--index-strategy", "unsafe-best-match"]
    env: dict[str, str] = {}
    if settings.get("index-url"):
        options += ["--index-url", settings["index-url"]]
    for option, flag in LIST_OPTIONS.items():
        for item in settings.get(option, "").split():
            options += [flag, item]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("timeout") or settings.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = settings.get("timeout") or settings["default-timeout"]
    return options, env


def command(args: Sequence[str], settings: dict[str, str], python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The uv command line (and extra environment) that installs ``args`` into ``python``'s
    environment; ``--uninstall`` first removes the named packages instead."""
    base = [python, "-m", "uv", "pip"]
    if args and args[0] == "--uninstall":
        return [*base, "uninstall", "--quiet", "--python", python, *args[1:]], {}
    options, env = uv_options(settings)
    return [*base, "install", "--quiet", "--compile-bytecode", "--python", python, *options, *args], env


def ensure_uv() -> None:
    """Install :data:`UV` into this interpreter with pip (and pip's settings) unless uv is there."""
    if importlib.util.find_spec("uv") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", UV], check=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    ensure_uv()
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    cmd, env = command(args, pip_settings(listed.stdout.splitlines()))
    return subprocess.run(cmd, env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main())
