"""The viewer opened in a real browser: headless Chromium (Debian's ``chromium``) loads the pages
from disk, and the DOM it builds is checked; a screenshot of a critiqued episode is saved.

The session fixture installs ``chromium`` with apt-get when it is missing and skips, saying why,
only when that install fails.  The run directory is made by :mod:`viewer_helpers` and the site
by the console script exactly as a person would run it: ``cast-rl view DIR --out OUT``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from viewer_helpers import make_pipeline_run  # noqa: E402

CAST_RL = Path(sys.executable).with_name("cast-rl")


@pytest.fixture(scope="session")
def chromium() -> str:
    """The chromium binary, installed from Debian's package when missing."""
    found = shutil.which("chromium")
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=600"]  # wait for another apt run instead of failing
    steps = (["apt-get", *lock, "update"], ["apt-get", *lock, "install", "-y", "--no-install-recommends", "chromium"])
    for cmd in steps:
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
        if result.returncode != 0:
            pytest.skip(f"installing chromium failed ({' '.join(cmd)}): {result.stderr.strip()[-300:]}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get installed chromium but no chromium binary is on PATH")
    return found


def _chromium(binary: str, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    profile = tmp / "chromium-profile"
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=180, check=True,
    )


class _Elements(HTMLParser):
    """Every element's tag and attributes, and the text inside <mark class="ev ...">."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.marks: list[str] = []
        self.text = ""
        self._in_mark = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.elements.append((tag, a))
        if tag == "mark" and "ev" in (a.get("class") or "").split():
            self._in_mark += 1
            self.marks.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "mark" and self._in_mark:
            self._in_mark -= 1

    def handle_data(self, data: str) -> None:
        self.text += data
        if self._in_mark:
            self.marks[-1] += data

    def having(self, attribute: str) -> list[tuple[str, dict[str, str | None]]]:
        return [(t, a) for t, a in self.elements if attribute in a]


def _dom(binary: str, page: Path, tmp: Path, query: str = "") -> _Elements:
    parsed = _Elements()
    parsed.feed(_chromium(binary, "--dump-dom", page.resolve().as_uri() + query, tmp=tmp).stdout)
    return parsed


def test_viewer_in_headless_chromium(chromium: str, tmp_path: Path) -> None:
    run, task = make_pipeline_run(tmp_path)
    critiqued = [f"collect-retail-test-t{task}-r0", f"eval_before-critic_b1-retail-test-t{task}-r0"]
    out = tmp_path / "site"
    result = subprocess.run([str(CAST_RL), "view", str(run), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (out / "index.html").is_file()

    # the index: one element per episode with data-episode (2 evaluations x 2 configurations
    # x 3 tasks x 2 trials, plus 3 collected), rendered by the browser with its script run
    index = _dom(chromium, out / "index.html", tmp_path)
    episodes = index.having("data-episode")
    assert len(episodes) == 27 and all(tag == "tr" for tag, _ in episodes)
    assert len({a["data-episode"] for _, a in episodes}) == 27
    critiques = index.having("data-critique")
    assert len(critiques) == 2  # before: critic B=1 and the collected episode, one round each
    assert sorted(a["data-critique"].split("/")[0] for _, a in critiques) == critiqued
    assert "27 of 27 shown" in index.text  # the filter script ran
    # filters from the address: failed episodes with critiques are the two critiqued ones
    filtered = _dom(chromium, out / "index.html", tmp_path, "?outcome=failure&critiqued=1")
    shown = [a["data-episode"] for _, a in filtered.having("data-episode") if "hidden" not in a]
    assert sorted(shown) == critiqued
    assert "2 of 27 shown" in filtered.text

    # the critiqued episode: the round, its evidence highlighted where it quotes, the labels
    page = out / "episodes" / f"{critiqued[0]}.html"
    episode = _dom(chromium, page, tmp_path)
    (article,) = episode.having("data-episode")
    assert article[1]["data-episode"] == critiqued[0]
    (critique,) = episode.having("data-critique")
    assert critique[0] == "section" and critique[1]["data-critique"] == "critique-1"
    assert "Before any action that changes the database" in episode.marks  # quoted from the policy
    assert any(re.fullmatch(r"#W\d{7}", m) for m in episode.marks)       # the order id in message 1
    labels = [a for t, a in episode.elements if "label" in (a.get("class") or "").split()]
    assert len(labels) == 4 and any("invalid" in a["class"] for a in labels)
    outcome = [a for t, a in episode.elements if a.get("class") == "diff"]
    assert outcome, "a failed episode shows its final database against the gold one"

    shot = tmp_path / "episode.png"
    _chromium(chromium, f"--screenshot={shot}", "--window-size=1400,2200", page.resolve().as_uri(), tmp=tmp_path)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index_shot = tmp_path / "index.png"
    _chromium(chromium, f"--screenshot={index_shot}", "--window-size=1400,900", (out / "index.html").resolve().as_uri(),
              tmp=tmp_path)
    keep = os.environ.get("CAST_VIEWER_SCREENSHOTS")  # a directory to keep them in, for a person to look at
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
        shutil.copy(index_shot, Path(keep) / index_shot.name)
