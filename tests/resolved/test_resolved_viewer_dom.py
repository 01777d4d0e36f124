"""Issue 16's check on a directory the real ``cast-rl eval`` wrote:

    cast-rl view DIR --out OUT
    chromium --headless --dump-dom file://OUT/index.html

shows one element per episode carrying ``data-episode``, and at least one element with
``data-critique`` when the run had critiques.

``tests/viewer/test_viewer_browser.py`` runs the same two commands on a run directory built by
its helpers from real parts; here ``DIR`` is what ``cast-rl eval`` itself writes (its trajectory
files, ``config.json`` and report), so a change in the evaluation's output that the viewer does
not follow breaks this test.  The policy is the expert (``inference.backend=expert``: no model is
served) on benchmark retail tasks, without and with the rule critic: every episode, and every
critique round the critic made, must be in the page the browser built.  On these tasks the rule
critic flags some of the expert's replies (values the scripted user has not said yet), so the
run has critiques today; the count checked is whatever the trajectory files hold.

Chromium is Debian's ``chromium`` package (the viewer tests install it when missing, see
``conftest.py``); as root it needs ``--no-sandbox``.

Run: .venv/bin/python -m pytest tests/resolved/test_resolved_viewer_dom.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from cast_rl.cli import main as cli

CAST_RL = Path(sys.executable).with_name("cast-rl")
TASKS = [0, 22, 87]  # a task the critic leaves alone and two whose expert replies it flags today


class _Attributes(HTMLParser):
    """(tag, attributes) of every element of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def having(self, attribute: str) -> list[tuple[str, dict[str, str | None]]]:
        return [(t, a) for t, a in self.elements if attribute in a]


def dump_dom(chromium: str, page: Path, profile: Path) -> _Attributes:
    """``chromium --headless --dump-dom file://PAGE``: the DOM after the page's scripts ran."""
    sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []  # chromium refuses root without it
    done = subprocess.run(
        [chromium, "--headless", *sandbox, "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
         "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180, check=True,
    )
    parsed = _Attributes()
    parsed.feed(done.stdout)
    return parsed


def test_view_of_a_cast_rl_eval_directory_in_headless_chromium(
    chromium: str, ray_local, benchmarks_dir: Path, tiny_model_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    run = tmp_path / "eval"
    assert cli([
        "eval", "default", f"run_dir={tmp_path / 'run'}", f"policy.path={tiny_model_dir}",
        "env.domain=retail", f"env.data_dir={benchmarks_dir / 'retail'}", "env.split=test",
        f"env.task_indices={json.dumps(TASKS)}", "inference.backend=expert", "critic.backend=rule",
        "rollout.num_workers=1", "eval.trials=1", "eval.verification_budgets=[0,1]", "logging.mode=disabled",
        "--out", str(run),
    ]) == 0
    records = {path.stem: [json.loads(line) for line in path.read_text().splitlines()]
               for path in sorted((run / "trajectories").glob("*.jsonl"))}
    assert sorted(records) == ["critic_b1", "no_critic"] and all(len(r) == len(TASKS) for r in records.values())
    rounds = {(name, r["task_index"]): len(r["verification_rounds"]) for name, rs in records.items() for r in rs}
    print(f"critique rounds per (configuration, task): {rounds}")

    out = tmp_path / "site"
    done = subprocess.run([str(CAST_RL), "view", str(run), "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert (out / "index.html").is_file()

    index = dump_dom(chromium, out / "index.html", tmp_path / "profile")
    episodes = index.having("data-episode")
    assert len(episodes) == len(rounds)  # one element per episode
    assert len({a["data-episode"] for _, a in episodes}) == len(rounds)
    critiques = index.having("data-critique")
    assert len(critiques) == sum(rounds.values())  # one badge per critique round
    if sum(rounds.values()):
        assert critiques  # the run had critiques: the page shows them
    assert not any(rounds[("no_critic", t)] for t in TASKS)

    # an episode page carries its rounds inline, one <section data-critique> each
    flagged = [(name, t) for (name, t), n in rounds.items() if n]
    for name, task in flagged[:1]:
        (page,) = (out / "episodes").glob(f"{name}-retail-test-t{task}-r0.html")
        episode = dump_dom(chromium, page, tmp_path / "profile")
        assert len(episode.having("data-episode")) == 1
        sections = [t for t, _ in episode.having("data-critique")]
        assert sections == ["section"] * rounds[(name, task)]
