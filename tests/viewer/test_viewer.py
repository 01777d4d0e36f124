"""The trajectory viewer without a browser: which files it reads, evidence highlighting, the final
database against the gold one, old and new trajectory formats, the CLI and the pipeline report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cast_rl.viewer import build_viewer
from cast_rl.viewer.outcome import outcome_diff, replayed_actions, resolve_data
from cast_rl.viewer.site import episode_view, highlight
from cast_rl.viewer.sources import Source, ViewerInputError, discover

sys.path.insert(0, str(Path(__file__).parent))
from viewer_helpers import make_pipeline_run  # noqa: E402

CAST_RL = Path(sys.executable).with_name("cast-rl")


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    return make_pipeline_run(tmp_path_factory.mktemp("viewer"))


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_discover_pipeline_eval_and_collection_dirs(pipeline_run: tuple[Path, int], tmp_path: Path) -> None:
    run, _ = pipeline_run
    sources = discover(run)
    assert [(s.key, s.configuration) for s in sources] == [
        ("eval_before-critic_b1", "before: critic B=1"), ("eval_before-no_critic", "before: no critic"),
        ("eval_after-critic_b1", "after: critic B=1"), ("eval_after-no_critic", "after: no critic"),
        ("collect", "collect"),
    ]
    assert sources[-1].labels == run / "03_label" / "labels.jsonl"
    assert all(s.labels is None for s in sources[:-1])
    assert [s.key for s in discover(run / "01_eval_before")] == ["critic_b1", "no_critic"]
    assert [s.key for s in discover(run / "02_collect")] == ["02_collect"]
    with pytest.raises(ViewerInputError, match="no trajectories found"):
        discover(tmp_path)


def test_highlight_overlapping_quotes() -> None:
    c = {"quote": "bcd", "css": "ev-critique", "title": "critique 1", "ref": "critique-1"}
    lab = {"quote": "cde", "css": "ev-label", "title": "label 2", "ref": "label-2"}
    missing = {"quote": "zz", "css": "ev-label", "title": "label 3", "ref": "label-3"}
    segments = highlight("abcdefc", [c, lab, missing])
    assert [(s["text"], s["css"]) for s in segments] == [
        ("a", ""), ("b", "ev-critique"), ("cd", "ev-critique ev-label"), ("e", "ev-label"), ("fc", ""),
    ]
    assert segments[2]["refs"] == "critique-1 label-2"
    assert highlight("", [c]) == []


def test_outcome_of_a_wrong_write_and_of_a_solved_episode(pipeline_run: tuple[Path, int]) -> None:
    run, _ = pipeline_run
    data, notes = resolve_data(run, None)
    assert notes == [] and list(data) == ["retail"]
    solved, wrong, critiqued = _records(run / "02_collect" / "trajectories.jsonl")
    ok = outcome_diff(data["retail"], solved)
    assert ok["r_actions"] == 1.0 and ok["rows"] == []
    # the write went to an order that does not exist: the gold change is missing
    gold_write = data["retail"].task("test", wrong["task_index"]).actions[-1]
    bad = outcome_diff(data["retail"], wrong)
    assert bad["r_actions"] == 0.0 and bad["rows"]
    assert {(r["table"], r["record"]) for r in bad["rows"]} == {("orders", gold_write.kwargs["order_id"])}
    assert bad["gold_actions"][-1] == {"name": gold_write.name, "kwargs": gold_write.kwargs}
    # the proposal the critic rejected never ran: only the reads and the replies are replayed
    names = [a.name for a in replayed_actions(critiqued["messages"])]
    assert gold_write.name not in names and names[-1] == "respond"


def test_episode_view_reads_old_and_new_records_defensively() -> None:
    source = Source("x", "x", Path("t.jsonl"))
    # an old minimal line: no rounds, no info, list content; plus keys a newer writer may add
    record = {
        "domain": "retail", "split": "test", "task_index": 1, "trial": 0, "reward": 1, "policy_version": 0,
        "messages": [{"role": "system", "content": "Be kind."},
                     {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
                     {"role": "assistant", "content": "hello"}],
        "turns": [{"message_index": 2, "verdict": "valid", "executed": True, "token_spans": [[0, 3]]}],
        "some_future_key": {"a": 1},
        "verification_rounds": [{"message_index": 99, "proposal": {"name": "respond", "kwargs": {}},
                                 "critique": {"verdict": "invalid", "rationale": {"evidence": [
                                     {"message_index": None, "quote": "kind"},
                                     {"message_index": 1, "quote": "not there"}]}}}],
    }
    view = episode_view(source, 3, record, [], Counter())
    assert view["id"] == "x-retail-test-t1-r0" and view["success"] and view["termination"] == ""
    assert "".join(s["text"] for s in view["messages"][1]["segments"]) == "hi there"
    assert view["messages"][2]["turn"]["verdict"] == "valid"
    (orphan,) = view["orphan_rounds"]  # a round whose message index is out of range is kept
    assert [e["found"] for e in orphan["evidence"]] == [True, False]
    assert [s["text"] for s in view["messages"][0]["segments"] if s["marks"]] == ["kind"]  # quoted policy


def test_viewer_pages(pipeline_run: tuple[Path, int], tmp_path: Path) -> None:
    run, task = pipeline_run
    index = build_viewer(run, tmp_path / "site")
    html = index.read_text()
    assert html.count("<tr data-episode=") == 27 and html.count("data-critique=") == 2
    assert (tmp_path / "site" / "static" / "viewer.js").is_file()
    page = (tmp_path / "site" / "episodes" / f"eval_before-critic_b1-retail-test-t{task}-r0.html").read_text()
    assert page.count("<section class=\"critique invalid\" data-critique=") == 1
    assert "critic: invalid" in page and "not run" in page  # from the per-turn record ("turns")
    assert '<details class="msg system"' in page  # the system prompt collapsed
    assert '<mark class="ev ev-critique"' in page and "Final database against the gold outcome" in page
    solved = (tmp_path / "site" / "episodes" / f"eval_after-no_critic-retail-test-t{task}-r0.html").read_text()
    assert "Final database" not in solved
    collected = (tmp_path / "site" / "episodes" / f"collect-retail-test-t{task}-r0.html").read_text()
    labels = _records(run / "03_label" / "labels.jsonl")
    assert collected.count('<div class="label ') == sum(1 for lab in labels if lab["trajectory_index"] == 2)
    assert "labeller:" in collected and "ev-label" in collected
    # the labeller marks the action that failed an episode; the page says so beside it
    decisive = {lab["trajectory_index"] for lab in labels if lab.get("decisive")}
    trajectories = _records(run / "02_collect" / "trajectories.jsonl")
    assert decisive, "the labeller marked no decisive action in the failed episodes"
    for i, t in enumerate(trajectories):
        page = (tmp_path / "site" / "episodes" / f"collect-retail-test-t{t['task_index']}-r0.html").read_text()
        assert ('<span class="badge decisive"' in page) == (i in decisive)


def test_missing_config_degrades_with_a_note(pipeline_run: tuple[Path, int], tmp_path: Path) -> None:
    run, task = pipeline_run
    copy = tmp_path / "eval"
    shutil.copytree(run / "01_eval_before", copy)
    index = build_viewer(copy, tmp_path / "site")
    assert "no config.json in" in index.read_text()
    page = (tmp_path / "site" / "episodes" / f"critic_b1-retail-test-t{task}-r0.html").read_text()
    assert "no retail data resolved for this run" in page
    # with the run's config the difference is back
    build_viewer(copy, tmp_path / "site2", config=run / "config.json")
    page = (tmp_path / "site2" / "episodes" / f"critic_b1-retail-test-t{task}-r0.html").read_text()
    assert '<table class="diff">' in page


def test_cli_view_and_its_errors(pipeline_run: tuple[Path, int], tmp_path: Path) -> None:
    run, _ = pipeline_run
    out = tmp_path / "out"
    done = subprocess.run([str(CAST_RL), "view", str(run / "01_eval_before"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"viewer: {out / 'index.html'}"
    assert (out / "index.html").read_text().count("<tr data-episode=") == 12
    bad = tmp_path / "bad"
    (bad / "trajectories").mkdir(parents=True)
    (bad / "trajectories" / "no_critic.jsonl").write_text('{"domain": "retail"}\n[1, 2]\n')
    failed = subprocess.run([str(CAST_RL), "view", str(bad)], capture_output=True, text=True, timeout=300)
    assert failed.returncode == 2
    assert f"{bad / 'trajectories' / 'no_critic.jsonl'}:2: expected a JSON object" in failed.stderr

