"""Issue 15's trait table: with the expert policy and each trait-steered scripted user, the share of
every domain's test tasks still solved is what the docs say it is, cell for cell.

``docs/evaluating.md`` ("Checking a set-up with the expert") gives the table made with ``cast-rl eval
configs/four_domains_eval.yaml inference.backend=expert eval.trials=1 eval.verification_budgets=[0]
user.trait=T user.trait_level=L``.  This test reads that table from that page and plays the same
episodes: the same config file and overrides, the same episode runner the rollout workers run
(in-process here, without Ray, so the nine rows take minutes rather than most of an hour).  A
change to the users, the traits, the expert or the reward that moves any cell fails until the
page says what it now measures.  Needs ``../shared/benchmarks``; ``slow`` (about 3 minutes).

Run: .venv/bin/python -m pytest tests/resolved/test_resolved_trait_table.py -q -m slow
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from cast_rl.config import load_config
from cast_rl.envs.core import load_domain_data
from cast_rl.rollout.expert import ExpertTokenizer
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

REPO = Path(__file__).resolve().parents[2]
TABLE_PAGE = "docs/evaluating.md"  # where the trait table is written
HEADER = "| scripted user | retail | airline | telecom | telehealth | overall pass^1 |"
CELL = re.compile(r"(\d+)/(\d+) \((\d\.\d\d)\)")

pytestmark = pytest.mark.slow


def table_rows() -> dict[str, dict[str, tuple[int, int]]]:
    """Row label -> domain -> (solved, tasks), and the overall pass^1 under key "overall"."""
    lines = (REPO / TABLE_PAGE).read_text().splitlines()
    start = lines.index(HEADER)
    domains = [c.strip() for c in HEADER.strip("|").split("|")][1:5]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        label, *cells, overall = [c.strip() for c in line.strip("|").split("|")]
        parsed = {d: CELL.fullmatch(c) for d, c in zip(domains, cells, strict=True)}
        assert all(parsed.values()), f"{TABLE_PAGE} trait table: cannot read {line!r}"
        rows[label] = {d: (int(m[1]), int(m[2])) for d, m in parsed.items()} | {"overall": float(overall)}
    assert rows, f"{TABLE_PAGE} trait table has no rows"
    return rows


ROWS = table_rows()


@pytest.fixture(scope="module")
def expert(tiny_model_dir: Path) -> ExpertTokenizer:
    return ExpertTokenizer(str(tiny_model_dir))  # the expert needs only a tokenizer


@pytest.mark.parametrize("row", list(ROWS))
def test_trait_row_matches_the_table(row: str, expert: ExpertTokenizer, benchmarks_dir: Path) -> None:
    overrides = ["inference.backend=expert", "eval.trials=1", "eval.verification_budgets=[0]"]
    if row != "no trait":
        trait, level = row.split()
        overrides += [f"user.trait={trait}", f"user.trait_level={level}"]
    measured = {}
    for domain, (_, tasks) in ((d, v) for d, v in ROWS[row].items() if d != "overall"):
        cfg = load_config(REPO / "configs" / "four_domains_eval.yaml",
                          [f"env.domain={domain}", f"env.data_dir={benchmarks_dir / domain}", *overrides])
        data = load_domain_data(domain, benchmarks_dir / domain)
        assert len(data.tasks("test")) == tasks
        runner = EpisodeRunner(cfg, data, expert)
        trajectories = asyncio.run(runner.run_many([EpisodeSpec("test", i, 0) for i in range(tasks)]))
        measured[domain] = (sum(t.reward == 1.0 for t in trajectories), tasks)
    expected = {d: v for d, v in ROWS[row].items() if d != "overall"}
    assert measured == expected, f"{row}: measured {measured}, {TABLE_PAGE} {expected}"
    solved, total = (sum(v[i] for v in measured.values()) for i in (0, 1))
    assert round(solved / total, 3) == ROWS[row]["overall"]
