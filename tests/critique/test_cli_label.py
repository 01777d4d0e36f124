"""``cast-rl label`` and ``cast-rl critic build-data / eval`` end to end on generated retail data."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cast_rl.cli import main
from cast_rl.critique.datasets import LabelFormatError
from cast_rl.critique.gold import gold_trajectory
from cast_rl.critique.inject import INJECTORS, inject
from cast_rl.envs.core import load_domain_data
from cast_rl.records import TrajectoryFormatError, write_trajectories
from cast_rl.telemetry.metrics import read_offline_history


@pytest.fixture(scope="module")
def files(retail_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    data = load_domain_data("retail", retail_data_dir)
    trajectories, injected = [], []
    for split in data.splits:
        for i in range(len(data.tasks(split))):
            trajectories.append(gold_trajectory(data, split, i))
            for kind in INJECTORS:
                one = inject(kind, data, split, i)
                if one is not None:
                    injected.append((len(trajectories), one.message_index))
                    trajectories.append(one.trajectory)
    out = tmp_path_factory.mktemp("label")
    write_trajectories(out / "T.jsonl", trajectories)
    (out / "injected.json").write_text(json.dumps(injected))
    return {"dir": out, "T": out / "T.jsonl", "L": out / "L.jsonl", "data": retail_data_dir}


def _label(files: dict[str, Path], trajectories: Path, out: Path, run_dir: Path | None = None) -> int:
    """``cast-rl label``; its W&B run goes under ``run_dir`` (default: beside ``out``, so tests
    that share the module's files in any order never read each other's runs)."""
    run_dir = run_dir or out.parent / f"run-{out.stem}"
    return main(["label", *_env(files), f"run_dir={run_dir}",
                 "--trajectories", str(trajectories), "--out", str(out)])


def _env(files: dict[str, Path]) -> list[str]:
    """The config overrides naming the data the trajectories were collected on."""
    return ["env.domain=retail", f"env.data_dir={files['data']}"]


def test_label_cli_writes_one_line_per_action_and_a_summary(files, capsys, tmp_path) -> None:  # noqa: ANN001
    assert _label(files, files["T"], files["L"], run_dir=tmp_path / "run") == 0
    labels = [json.loads(line) for line in files["L"].read_text().splitlines()]
    keys = {"trajectory_index", "message_index", "action", "verdict", "error_type", "rationale", "source"}
    assert all(set(lab) - {"decisive"} == keys and lab.get("decisive", True) is True for lab in labels)
    by_key = {(lab["trajectory_index"], lab["message_index"]): lab for lab in labels}
    injected = json.loads((files["dir"] / "injected.json").read_text())
    assert all(by_key[tuple(k)]["verdict"] == "invalid" for k in injected)
    # every injected trajectory failed (reward 0) because of an invalid action: one is decisive
    decisive = [lab["trajectory_index"] for lab in labels if lab.get("decisive")]
    assert sorted(decisive) == sorted(t for t, _ in injected)
    err = capsys.readouterr().err
    assert "leakage drops: 0" in err and "verdicts: invalid=" in err
    (run,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    (row,) = read_offline_history(run)
    assert row["label/actions"] == len(labels)
    assert row["label/leakage_drops"] == 0
    assert (row["label/failed_trajectories"], row["label/unexplained_failures"]) == (len(injected), 0)


def test_label_cli_names_file_and_line_of_a_bad_trajectory(files, tmp_path) -> None:  # noqa: ANN001
    good = files["T"].read_text().splitlines()[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n" + '{"domain": "retail", "messages": []}\n')
    with pytest.raises(TrajectoryFormatError, match=r"bad\.jsonl:2: .*missing keys"):
        _label(files, bad, tmp_path / "L.jsonl")
    other = tmp_path / "other.jsonl"
    other.write_text(good + "\n" + good.replace('"domain": "retail"', '"domain": "airline"') + "\n")
    with pytest.raises(TrajectoryFormatError, match=r"other\.jsonl:2: .*domain 'airline'"):
        _label(files, other, tmp_path / "L.jsonl")


def test_build_data_writes_balanced_parquet_splits(files, capsys, tiny_model_dir) -> None:  # noqa: ANN001
    if not files["L"].exists():
        _label(files, files["T"], files["L"])
    out = files["dir"] / "critic"
    assert main(["critic", "build-data", "pipeline.critic_heldout_fraction=0.25", "--labels", str(files["L"]),
                 "--trajectories", str(files["T"]), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    seen: dict[str, set[int]] = {}
    for split in ("train", "heldout"):
        table = pq.read_table(out / f"{split}.parquet").to_pylist()
        assert table and summary[split]["valid"] == summary[split]["invalid"] == len(table) // 2
        for row in table:
            messages = json.loads(row["prompt_messages"])
            assert [m["role"] for m in messages] == ["system", "user"]
            assert row["completion"].startswith(f"VERDICT: {row['verdict']}\nERROR: {row['error_type']}\n")
        seen[split] = {row["trajectory_index"] for row in table}
    assert not seen["train"] & seen["heldout"]
    # the learner's supervised mode reads these files
    from transformers import AutoTokenizer

    from cast_rl.samples.parquet import supervised_from_parquet

    samples = supervised_from_parquet(out / "heldout.parquet", AutoTokenizer.from_pretrained(tiny_model_dir))
    assert len(samples) == summary["heldout"]["examples"]
    # the rule critic on the held-out split: it agrees wherever visible rules decide; it cannot
    # see wrong tool usage that only the gold actions or the environment reveal
    assert main(["critic", "eval", *_env(files), "--data", str(out / "heldout.parquet")]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["critic/false_positive_rate"] <= 0.05
    assert metrics["critic/type_accuracy_detected"] >= 0.95
    assert metrics["critic/recall"] >= 0.6


def test_build_data_keeps_more_valid_examples_in_training_only(files, capsys) -> None:  # noqa: ANN001
    """``pipeline.critic_valid_per_invalid``: the training split keeps that many valid examples per
    invalid one (as far as the valid ones go); the held-out split stays balanced."""
    if not files["L"].exists():
        _label(files, files["T"], files["L"])
    runs = {}
    for ratio in (1, 3):
        out = files["dir"] / f"critic-ratio{ratio}"
        assert main(["critic", "build-data", "pipeline.critic_heldout_fraction=0.25",
                     f"pipeline.critic_valid_per_invalid={ratio}", "--labels", str(files["L"]),
                     "--trajectories", str(files["T"]), "--out", str(out)]) == 0
        runs[ratio] = json.loads(capsys.readouterr().out)
    one, three = runs[1]["train"], runs[3]["train"]
    assert one["valid"] == one["invalid"] > 0
    assert three["valid"] > one["valid"]
    assert three["valid"] <= 3 * three["invalid"] and (three["valid"] == 3 * three["invalid"]
                                                       or three["invalid"] < one["invalid"])
    assert runs[3]["heldout"] == runs[1]["heldout"]
    assert runs[3]["heldout"]["valid"] == runs[3]["heldout"]["invalid"]


def test_build_data_names_file_and_line_of_a_bad_label(files, tmp_path) -> None:  # noqa: ANN001
    labels = tmp_path / "L.jsonl"
    labels.write_text('{"trajectory_index": 0}\n')
    with pytest.raises(LabelFormatError, match=r"L\.jsonl:1: .*missing keys"):
        main(["critic", "build-data", "--labels", str(labels), "--trajectories", str(files["T"]),
              "--out", str(tmp_path / "out")])
