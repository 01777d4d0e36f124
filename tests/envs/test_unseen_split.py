"""Held-out means unseen: databases generated with seeds training never reads.

``eval.unseen_seeds`` adds one split per seed (``unseen-<seed>``), each on its own generated
database, served by the training data's workers through :meth:`DomainData.link_split`; nothing
the policy's tokenizer is built from comes from an evaluation split or an unseen database; the
report pools the unseen databases as ``retail/unseen``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cast_rl.config import ConfigError, load_config
from cast_rl.envs.core import ToolEnv
from cast_rl.envs.setup import data_dir_for, episode_units, load_env_data, unseen_data_dirs
from cast_rl.envs.types import Action
from cast_rl.models.setup import training_corpus
from cast_rl.models.tiny import corpus_from_paths

OVERRIDES = ["env.generated_tasks=15", "env.generated_kinds=[cancel]", "env.generated_compact=true",
             "env.generated_auth=email", "eval.unseen_seeds=[1000,1001]", "eval.unseen_tasks=5",
             "env.task_indices=[0,1]"]


def _cfg(tmp_path: Path, *extra: str):  # noqa: ANN202
    return load_config(None, [f"run_dir={tmp_path}", *OVERRIDES, *extra])


def test_unseen_seeds_are_disjoint_from_the_training_seed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="eval.unseen_seeds.*env.generated_seed=1000: training reads that database"):
        _cfg(tmp_path, "env.generated_seed=1000")
    with pytest.raises(ConfigError, match="eval.unseen_seeds.*not allowed with env.data_dir"):
        _cfg(tmp_path, f"env.data_dir={tmp_path}")
    with pytest.raises(ConfigError, match="list each seed once"):
        _cfg(tmp_path, "eval.unseen_seeds=[3,3]")


def test_quickstart_evaluates_unseen_databases_training_never_reads() -> None:
    cfg = load_config(Path(__file__).parents[2] / "configs" / "quickstart.yaml")
    training_seeds = {cfg.env.generated_seed}
    assert cfg.eval.unseen_seeds and training_seeds.isdisjoint(cfg.eval.unseen_seeds)
    assert len(cfg.eval.unseen_seeds) * cfg.eval.unseen_tasks >= 40 and cfg.eval.trials >= 8


def test_unseen_splits_run_on_their_own_database(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    data = load_env_data(cfg)
    assert data.splits == ["test", "train", "unseen-1000", "unseen-1001"]
    dirs = unseen_data_dirs(cfg)
    assert set(dirs) == {"unseen-1000", "unseen-1001"} and all(p.parent == data.data_dir.parent for p in dirs.values())
    unseen_users = set(json.loads((dirs["unseen-1000"] / "db" / "users.json").read_text()))
    task = data.task("unseen-1000", 0)
    assert task.user_id in unseen_users and len(data.tasks("unseen-1000")) == 5
    assert task.user_id not in data.db["users"]  # the training database does not hold the user
    env = ToolEnv(data, "unseen-1000", 0)
    assert task.user_id in env.db["users"]
    training_user = data.task("train", 0).user_id
    assert env.step(Action("get_user_details", {"user_id": training_user})).observation.startswith("Error")
    env = ToolEnv(data, "unseen-1000", 0)
    for action in task.actions:
        if action.name != "respond":
            env.apply(action)
    assert env.reward()[0] == 1.0  # the gold replay ran on the unseen database too
    with pytest.raises(KeyError):
        ToolEnv(data, "train", 0).db["users"][task.user_id]
    # every task of an unseen split runs; env.task_indices selects training data's tasks only
    units = episode_units(_with_split(cfg, "unseen-1001"), data, trials=2)
    assert units == [("unseen-1001", i, t) for i in range(5) for t in range(2)]
    assert len(episode_units(cfg, data, trials=1)) == 2  # the test split: task_indices [0, 1]


def _with_split(cfg, split: str):  # noqa: ANN001, ANN202
    import dataclasses

    return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, split=split))


def test_tokenizer_never_reads_an_unseen_database(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    data = load_env_data(cfg)
    paths = training_corpus(data.data_dir)
    assert paths == [data_dir_for(cfg)]
    text = "\n".join(corpus_from_paths(paths))
    assert data.task("train", 0).user_id in text
    for split in ("unseen-1000", "unseen-1001"):
        assert data.task(split, 0).instruction not in text, f"the tokenizer corpus holds a {split} task"
    unseen_ids = set(json.loads((unseen_data_dirs(cfg)["unseen-1000"] / "db" / "orders.json").read_text()))
    assert not any(order in text for order in unseen_ids)


def test_linking_refuses_another_policy(tmp_path: Path) -> None:
    from cast_rl.envs.core import load_domain_data
    from cast_rl.envs.generate import write_retail

    cfg = _cfg(tmp_path)
    data = load_env_data(cfg)
    write_retail(tmp_path / "full", seed=5, num_tasks=4, split="unseen-5")  # the full policy and tool list
    with pytest.raises(ValueError, match="their policy differ"):
        data.link_split("unseen-5", load_domain_data("retail", tmp_path / "full"))
