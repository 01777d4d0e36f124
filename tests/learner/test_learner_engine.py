"""The FSDP learner engine in-process (one gloo rank): steps, accumulation, KL, save, publish."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from cast_rl.inference.weight_sync import WeightSyncError
from cast_rl.learner.engine import LearnerEngine
from cast_rl.learner.loop import LocalLearner
from cast_rl.learner.sample import Sample
from cast_rl.learner.toy import HFCollector


def make_batch(n: int = 8, seed: int = 0, supervised: int = 2) -> list[Sample]:
    """Sequences of varied length; the last ``supervised`` are cross-entropy samples."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(8, 20, (1,), generator=g))
        ids = torch.randint(3, 600, (length,), generator=g).tolist()
        prompt = length // 2
        mask = [0] * prompt + [1] * (length - prompt)
        lps = [0.0] * prompt + (-torch.rand(length - prompt, generator=g) * 4).tolist()
        source = "supervised" if i >= n - supervised else "outcome_groups"
        adv = 0.0 if source == "supervised" else float(torch.randn(1, generator=g))
        out.append(Sample(f"s{seed}-{i}", source, ids, mask, lps, advantage=adv))
    return out


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_train_step_learns_and_reports_global_metrics(make_cfg) -> None:
    engine = LearnerEngine(make_cfg("algorithm.supervised_weight=1.0", "learner.lr=1e-2"))
    batch = make_batch(supervised=8)
    first = engine.train_step(batch)
    for _ in range(4):
        last = engine.train_step(batch)
    assert last["supervised_loss"] < first["supervised_loss"] - 0.5
    assert engine.version == 5 and last["policy_version"] == 5
    assert first["tokens"] == sum(len(s.token_ids) for s in batch)
    assert first["policy_tokens"] == 0 and first["pg_loss"] == 0.0
    assert first["grad_norm"] > 0 and first["tokens_per_s"] > 0


def _grads_at_step(engine: LearnerEngine) -> dict[str, torch.Tensor]:
    """Records, as float64, the gradients the optimizer consumes (after clipping) at each step."""
    grads: dict[str, torch.Tensor] = {}
    step = engine.optimizer.step

    def recording_step(*args, **kwargs):  # noqa: ANN202
        for name, p in engine.model.named_parameters():
            if p.grad is not None:
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                grads[name] = g.detach().double().clone()
        return step(*args, **kwargs)

    engine.optimizer.step = recording_step
    return grads


def test_gradient_accumulation_matches_one_big_micro_batch(make_cfg) -> None:
    """Accumulating 8 micro-batches sums the same per-token terms as one micro-batch of 8, only
    in another order, so the gradients agree to float32 rounding.  The bounds are derived from
    the dtype, not from one machine's rounding: the gradient difference is a small multiple of
    float32's epsilon relative to the gradient's norm (a wrong scale of one micro-batch, e.g. a
    mean of means, is off by percents), and the weights after AdamW's first step differ by
    exactly what the two recorded gradients predict (its update is lr * g / (|g| + eps)), up to
    the rounding of the weights themselves."""
    batch = make_batch(seed=1)
    lr, eps32 = 1e-3, torch.finfo(torch.float32).eps
    states, losses, grads, initial = [], [], [], None
    for mb in (1, 8):
        engine = LearnerEngine(make_cfg(f"learner.micro_batch_size={mb}", "learner.global_batch_size=8",
                                        "algorithm.old_logprobs=rollout", f"learner.lr={lr}"))
        initial = {k: v.double() for k, v in engine.full_state_dict().items()}
        grads.append(_grads_at_step(engine))
        losses.append(engine.train_step(batch))
        states.append({k: v.double() for k, v in engine.full_state_dict().items()})
    assert losses[0]["loss"] == pytest.approx(losses[1]["loss"], rel=1e-5)
    assert losses[0]["grad_norm"] == pytest.approx(losses[1]["grad_norm"], rel=1e-5)
    g1, g8 = grads
    assert g1.keys() == g8.keys() and g1
    norm = torch.sqrt(sum((g ** 2).sum() for g in g8.values()))
    diff = torch.sqrt(sum(((g1[k] - g8[k]) ** 2).sum() for k in g8))
    assert diff <= 100 * eps32 * norm, f"accumulated gradient off by {float(diff / norm):.3g} of its norm"

    adam_eps = engine.optimizer.defaults["eps"]
    assert g8.keys() <= states[0].keys()
    for key, g in g8.items():
        predicted = lr * ((g1[key] / (g1[key].abs() + adam_eps)) - (g / (g.abs() + adam_eps))).abs()
        slack = 4 * eps32 * (initial[key].abs() + lr)
        excess = (states[0][key] - states[1][key]).abs() - predicted - slack
        assert float(excess.max()) <= 0, f"{key}: weights differ beyond what the gradients predict"


def test_kl_to_the_frozen_reference_starts_at_zero_and_grows(make_cfg) -> None:
    engine = LearnerEngine(make_cfg("algorithm.kl_coef=0.1", "learner.lr=1e-2"))
    assert engine.ref_model is not None
    batch = make_batch(supervised=0)
    assert engine.train_step(batch)["kl"] == pytest.approx(0.0, abs=1e-7)
    assert engine.train_step(batch)["kl"] > 0


def test_save_hf_round_trip(make_cfg, tmp_path: Path) -> None:
    engine = LearnerEngine(make_cfg("learner.lr=1e-2"))
    engine.train_step(make_batch())
    out = engine.save_hf(tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    sample = make_batch(1, seed=5, supervised=0)[0]
    ids = torch.tensor([sample.token_ids])
    expected = torch.log_softmax(reloaded(input_ids=ids).logits[0, :-1].float(), -1)
    expected = expected.gather(-1, ids[0, 1:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(engine.logprobs([sample])[0][1:]), expected, atol=1e-5)


def test_published_weights_reach_the_collector_and_bad_syncs_are_loud(make_cfg) -> None:
    cfg = make_cfg("learner.lr=1e-2")
    learner = LocalLearner(LearnerEngine(cfg))
    collector = HFCollector(cfg.policy.path)
    learner.train_step(make_batch())
    version, state, checksum = learner.publish_weights()
    with pytest.raises(WeightSyncError, match="checksum"):
        collector.update_weights(version, state, "0" * 64)
    assert collector.update_weights(version, state, checksum) == 1
    with pytest.raises(WeightSyncError, match="not newer"):
        collector.update_weights(version, state, checksum)
    # the collector now samples from the learner's weights: same logprobs
    (traj,) = collector.collect([("test", 0, 0)])
    sample = Sample("t", "outcome_groups", traj.token_ids, traj.loss_mask, traj.logprobs)
    ours = learner.engine.logprobs([sample])[0]
    on = [i for i, m in enumerate(traj.loss_mask) if m]
    assert [ours[i] for i in on] == pytest.approx([traj.logprobs[i] for i in on], abs=1e-5)
    assert traj.policy_version == version


def test_frozen_identifier_rows_never_move_while_the_rest_trains(tmp_path: Path) -> None:
    """The tiny policy's whole-token identifiers are listed in config.json and the learner keeps
    their embedding rows (tied to the output head) exactly, through updates and weight decay;
    a saved model carries the list on, so later stages keep them frozen too."""
    from transformers import AutoTokenizer

    from cast_rl.config import load_config
    from cast_rl.config.schema import TinyConfig
    from cast_rl.models.tiny import make_tiny_model

    corpus = ["order #W1234567 and #W7654321 for noah_brown_1234; ids #W1111111 " * 3]
    model_dir = make_tiny_model(tmp_path / "m", TinyConfig(whole_tokens=[r"#W\d{7}", r"[a-z]+_[a-z]+_\d{4}"]),
                                extra_corpus=corpus)
    tok = AutoTokenizer.from_pretrained(model_dir)
    frozen = sorted(i for t, i in tok.get_vocab().items() if re.fullmatch(r"#W\d{7}|[a-z]+_[a-z]+_\d{4}", t))
    assert len(frozen) == 5  # the four above and the base corpus's #W2611340
    assert sorted(AutoModelForCausalLM.from_pretrained(model_dir).config.frozen_token_ids) == sorted(frozen)

    cfg = load_config(None, [f"policy.path={model_dir}", f"run_dir={tmp_path / 'run'}", "learner.lr=1e-2",
                             "learner.weight_decay=0.1", "logging.mode=disabled", "learner.checkpoint_every=null",
                             "learner.micro_batch_size=4", "learner.global_batch_size=8"])
    engine = LearnerEngine(cfg)
    before = engine.full_state_dict()["model.embed_tokens.weight"].clone()
    ids = tok("order #W1234567 and #W7654321 for noah_brown_1234")["input_ids"]
    batch = [Sample(f"s{i}", "supervised", ids, [1] * len(ids), [0.0] * len(ids)) for i in range(8)]
    for _ in range(3):
        engine.train_step(batch)
    after = engine.full_state_dict()["model.embed_tokens.weight"]
    moved = (after - before).abs().amax(dim=1)
    assert float(moved[frozen].max()) == 0.0  # exactly kept, trained on and decayed as they were
    others = [i for i in range(len(tok)) if i not in frozen]
    assert float(moved[others].max()) > 1e-3

    saved = engine.save_hf(tmp_path / "saved")
    assert sorted(AutoModelForCausalLM.from_pretrained(saved).config.frozen_token_ids) == sorted(frozen)


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_loss_token_logits_give_the_same_step_as_all_logits(make_cfg, kl_coef: float) -> None:
    """learner.logits=loss_tokens runs the output layer on loss positions only: same losses,
    same gradient norm and same weights after the step as the full forward, for policy-gradient,
    supervised and KL terms, across micro-batches of different padding."""
    batch = make_batch(seed=3, supervised=3)
    outs, states = [], []
    for logits in ("all", "loss_tokens"):
        engine = LearnerEngine(make_cfg(f"learner.logits={logits}", f"algorithm.kl_coef={kl_coef}",
                                        "learner.lr=1e-2"))
        outs.append([engine.train_step(batch), engine.train_step(batch)])
        states.append(engine.full_state_dict())
    for full, selected in zip(*outs):
        for key in ("loss", "pg_loss", "supervised_loss", "kl", "grad_norm"):
            assert selected[key] == pytest.approx(full[key], rel=1e-5, abs=1e-7), key
    assert outs[0][1]["kl"] > 0 if kl_coef else outs[0][1]["kl"] == 0
    assert _max_diff(states[0], states[1]) < 2e-5


def test_loss_token_logprobs_are_exact_where_selected_and_zero_elsewhere(make_cfg) -> None:
    from cast_rl.learner.batch import collate

    engine = LearnerEngine(make_cfg())
    mb = collate(make_batch(4, seed=4, supervised=1), engine.pad_id)
    where = mb.loss_mask > 0
    full = engine._forward_logprobs(engine.model, mb)
    selected = engine._forward_logprobs(engine.model, mb, where)
    assert where.any() and (~where).any()
    assert torch.allclose(selected[where], full[where], atol=1e-5)
    assert (selected[~where] == 0).all()


@pytest.mark.parametrize("logits", ["all", "loss_tokens"])
def test_policy_samples_are_scored_at_the_sampling_temperature(make_cfg, logits: str) -> None:
    """inference.temperature=0.5: a policy sample's log-probs are log_softmax(logits / 0.5) (the
    distribution the rollout drew it from), a supervised sample's log_softmax(logits)."""
    from cast_rl.learner.batch import collate

    engine = LearnerEngine(make_cfg("inference.temperature=0.5", f"learner.logits={logits}"))
    batch = make_batch(2, seed=6, supervised=1)  # one policy sample, one supervised
    mb = collate(batch, engine.pad_id)
    where = mb.loss_mask > 0 if logits == "loss_tokens" else None
    got = engine._forward_logprobs(engine.model, mb, where)
    with torch.no_grad():
        raw = engine.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float()
    for row, temperature in ((0, 0.5), (1, 1.0)):
        assert bool(mb.is_policy[row]) == (temperature == 0.5)
        expected = torch.log_softmax(raw[row] / temperature, -1).gather(-1, mb.targets[row, :, None]).squeeze(-1)
        mask = mb.loss_mask[row] > 0
        assert torch.allclose(got[row][mask], expected[mask], atol=1e-5)
    greedy = LearnerEngine(make_cfg("inference.temperature=0.0"))
    assert greedy.policy_temperature == 1.0


def test_set_lr_scales_the_next_steps_only(make_cfg) -> None:
    """``pipeline.grpo_lr``'s mechanism: after ``set_lr`` the next AdamW step moves every weight by
    that rate (AdamW's step and its weight decay are both proportional to it); the moments carry over."""

    def params(engine: LearnerEngine) -> dict[str, torch.Tensor]:
        return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().clone()
                for n, p in engine.model.named_parameters()}

    batch = make_batch(supervised=8)
    same, slower = (LearnerEngine(make_cfg("algorithm.supervised_weight=1.0", "learner.lr=1e-2")) for _ in range(2))
    for engine in (same, slower):
        engine.train_step(batch)
    slower.set_lr(1e-3)
    assert all(g["lr"] == 1e-3 for g in slower.optimizer.param_groups)
    start = params(same)
    assert _max_diff(start, params(slower)) == 0.0  # the same first step at the same rate
    for engine in (same, slower):
        engine.train_step(batch)
    moved, moved_slower = params(same), params(slower)
    for name in start:
        delta, delta_slower = moved[name] - start[name], moved_slower[name] - start[name]
        torch.testing.assert_close(delta_slower, delta / 10, rtol=1e-3, atol=2.5e-7)  # float32 weights near 1
    assert max(float(d.abs().max()) for d in (moved[n] - start[n] for n in start)) > 1e-4
