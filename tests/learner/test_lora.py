"""LoRA in the learner (``learner.lora``, peft): only the adapters train, the KL reference is the
base with the adapters disabled, the published and saved weights are the merged model under the
Hugging Face names (checked against peft's own ``merge_and_unload``), resume is exact, and two
FSDP2 ranks over gloo equal one process."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
from test_learner_engine import make_batch
from transformers import AutoModelForCausalLM

from cast_rl.config import load_config
from cast_rl.config.loader import ConfigError
from cast_rl.learner import lora
from cast_rl.learner.batch import collate, shard
from cast_rl.learner.engine import LearnerEngine
from cast_rl.learner.loop import LocalLearner
from cast_rl.learner.sample import Sample
from cast_rl.learner.toy import HFCollector

LORA = ("learner.lora.rank=4", "learner.lora.alpha=8")
TIMING = {"learner_step_s", "tokens_per_s"}


def _metrics(out: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in out.items() if k not in TIMING}


def test_only_the_adapters_train_and_the_base_stays_exact(make_cfg, learner_model_dir: Path) -> None:
    """Base weights (embedding included) are bit-for-bit the model directory's after steps with
    weight decay; the adapters' B matrices leave zero; the optimizer holds the adapters alone."""
    base = AutoModelForCausalLM.from_pretrained(learner_model_dir).state_dict()
    engine = LearnerEngine(make_cfg(*LORA, "learner.lr=1e-2", "learner.weight_decay=0.1"))
    trainable = {n: p for n, p in engine.model.named_parameters() if p.requires_grad}
    assert trainable and all(lora.is_adapter(n) for n in trainable)
    assert len(trainable) == 2 * 7 * engine.model.config.num_hidden_layers  # A and B on 7 linears per block
    held = [p for group in engine.optimizer.param_groups for p in group["params"]]
    assert len(held) == len(trainable) and {id(p) for p in held} == {id(p) for p in trainable.values()}
    n_train = sum(p.numel() for p in trainable.values())
    n_all = sum(p.numel() for p in engine.model.parameters())
    assert 0 < n_train < 0.2 * n_all, (n_train, n_all)

    before = {k: v.clone() for k, v in engine._gathered_state().items()}
    assert all(float(v.abs().max()) == 0 for k, v in before.items() if ".lora_B." in k)  # B starts at zero
    batch = make_batch(supervised=8)
    first = engine.train_step(batch)
    for _ in range(3):
        last = engine.train_step(batch)
    assert last["supervised_loss"] < first["supervised_loss"] - 0.1
    after = engine._gathered_state()
    assert after.keys() == before.keys()
    for key, value in after.items():
        if lora.is_adapter(key):
            if ".lora_B." in key:
                assert float(value.abs().max()) > 1e-3, key
        else:
            assert torch.equal(value, before[key]), key
            assert torch.equal(value, base[lora.plain_name(key)]), key
    assert engine._frozen is None  # the embedding is frozen anyway: no rows to restore


def test_kl_reference_is_the_base_with_the_adapters_disabled(make_cfg, monkeypatch) -> None:
    """algorithm.kl_coef > 0 with LoRA loads the model once; the reference log-probs are those of
    the untrained base (a full-fine-tuning engine that never stepped) while the policy's move."""
    loads: list[str] = []
    original = AutoModelForCausalLM.from_pretrained

    def counting(path, *args, **kwargs):  # noqa: ANN001, ANN202
        loads.append(str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counting)
    engine = LearnerEngine(make_cfg(*LORA, "algorithm.kl_coef=0.1", "learner.lr=1e-2"))
    assert engine.ref_model is None and len(loads) == 1
    batch = make_batch(supervised=0)
    assert engine.train_step(batch)["kl"] == pytest.approx(0.0, abs=1e-7)  # B = 0: policy == base
    assert engine.train_step(batch)["kl"] > 1e-4

    plain = LearnerEngine(make_cfg())
    mb = collate(make_batch(4, seed=9, supervised=1), engine.pad_id)
    where = mb.loss_mask > 0
    with torch.no_grad():
        base = plain._forward_logprobs(plain.model, mb, where)
        policy = engine._forward_logprobs(engine.model, mb, where)
    ref = engine._reference_logprobs(mb, where)
    torch.testing.assert_close(ref, base, rtol=0, atol=1e-6)
    assert float((policy - ref).abs().max()) > 1e-3  # the adapters are on again after the reference


def test_published_and_saved_weights_are_the_merged_model(make_cfg, learner_model_dir: Path, tmp_path: Path) -> None:
    """full_state_dict, iter_full_params and save_hf give W + alpha/r x B @ A under the Hugging Face
    names: equal to peft's merge_and_unload of the saved adapter on the base; the saved directory
    loads in transformers and scores as the engine does, and a collector takes the published state."""
    from peft import PeftModel

    cfg = make_cfg(*LORA, "learner.lr=1e-2")
    engine = LearnerEngine(cfg)
    for seed in range(2):
        engine.train_step(make_batch(seed=seed))
    merged = engine.full_state_dict()
    out = engine.save_hf(tmp_path / "hf")
    assert out is not None

    adapter_cfg = json.loads((out / lora.ADAPTER_DIR / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 4 and adapter_cfg["lora_alpha"] == 8
    assert adapter_cfg["base_model_name_or_path"] == str(learner_model_dir)
    assert (out / lora.ADAPTER_DIR / "adapter_model.safetensors").is_file()
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(learner_model_dir),
                                           out / lora.ADAPTER_DIR)
    expected = peft_model.merge_and_unload().state_dict()
    base = AutoModelForCausalLM.from_pretrained(learner_model_dir).state_dict()
    assert merged.keys() == expected.keys() == base.keys()
    for key in expected:
        torch.testing.assert_close(merged[key], expected[key], rtol=0, atol=1e-7, msg=key)
    moved = [k for k in base if not torch.equal(merged[k], base[k])]
    assert len(moved) == 7 * engine.model.config.num_hidden_layers  # every adapted linear, nothing else

    streamed = list(engine.iter_full_params())
    shapes = engine.param_shapes()
    assert [n for n, _ in streamed] == list(shapes)
    for name, tensor in streamed:
        assert tensor.shape == shapes[name].shape and torch.equal(tensor, merged[name]), name

    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.equal(v, merged[k]) for k, v in reloaded.state_dict().items())
    sample = make_batch(1, seed=5, supervised=0)[0]
    ids = torch.tensor([sample.token_ids])
    with torch.no_grad():
        logits = reloaded(input_ids=ids).logits[0, :-1].float()
    expected_lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(engine.logprobs([sample])[0][1:]), expected_lp, rtol=0, atol=1e-5)

    version, state, checksum = LocalLearner(engine).publish_weights()
    assert HFCollector(cfg.policy.path).update_weights(version, state, checksum) == version


def test_lora_resume_is_exact(make_cfg, tmp_path: Path) -> None:
    """Train 2 steps, checkpoint, train 2 more; a new engine resumed from the checkpoint trains the
    same 2 steps to the same bits: adapters, AdamW moments and the RNG (adapter dropout) restored.
    The checkpoint holds the adapters alone."""
    import torch.distributed.checkpoint as dcp

    cfg = make_cfg(*LORA, "learner.lora.dropout=0.1", "algorithm.kl_coef=0.05", "learner.lr=1e-2",
                   "learner.weight_decay=0.01")
    batches = [make_batch(seed=s, supervised=2) for s in range(4)]
    first = LearnerEngine(cfg)
    for batch in batches[:2]:
        first.train_step(batch)
    first.save_checkpoint(tmp_path / "ckpt")
    expected = [_metrics(first.train_step(b)) for b in batches[2:]]

    saved = dcp.FileSystemReader(str(tmp_path / "ckpt" / "train_state")).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    base_keys = {k for k in model_keys if not lora.is_adapter(k)}
    # torch's state dict lists a tied output embedding apart from the frozen input embedding
    assert model_keys and base_keys <= {"model.base_model.model.lm_head.weight"}, base_keys

    resumed = LearnerEngine(cfg)
    resumed.load_checkpoint(tmp_path / "ckpt", version=2)
    got = [_metrics(resumed.train_step(b)) for b in batches[2:]]
    assert got == expected
    assert resumed.version == first.version == 4
    a, b = first._gathered_state(), resumed._gathered_state()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = first.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and sa
    for i in sa:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            x, y = sa[i][name], sb[i][name]
            x, y = (t.full_tensor() if hasattr(t, "full_tensor") else t for t in (x, y))
            assert torch.equal(x, y), (i, name)

    fresh = LearnerEngine(cfg)  # the check can fail: without the checkpoint the steps differ
    assert _metrics(fresh.train_step(batches[2]))["loss"] != expected[0]["loss"]


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
def test_lora_refuses_adapters_on_the_embeddings(make_cfg) -> None:
    with pytest.raises(ValueError, match=r"learner\.lora\.target_modules"):
        LearnerEngine(make_cfg(*LORA, "learner.lora.target_modules=[embed_tokens,q_proj]"))


@pytest.mark.parametrize(("override", "message"), [
    ("learner.lora.rank=0", r"learner\.lora\.rank=0 .*null"),
    ("learner.lora.alpha=-1", r"learner\.lora\.alpha"),
    ("learner.lora.dropout=1.0", r"learner\.lora\.dropout"),
    ("learner.lora.target_modules=[]", r"learner\.lora\.target_modules"),
    ("learner.lora.sync=delta", r"learner\.lora\.sync"),
])
def test_lora_config_is_validated(override: str, message: str) -> None:
    assert not load_config(None, []).learner.lora.enabled  # off by default
    assert load_config(None, ["learner.lora.rank=8"]).learner.lora.enabled
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_rank_worker(rank: int, port: int, cfg, batches: list[list[Sample]], out: str) -> None:  # noqa: ANN001
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    engine = LearnerEngine(cfg, rank, 2)
    metrics = [_metrics(engine.train_step(shard(b, 2)[rank])) for b in batches]
    engine.save_checkpoint(Path(out) / "ckpt")
    state = engine.full_state_dict()
    streamed = dict(engine.iter_full_params())  # collective: every rank iterates
    if rank == 0:
        torch.save({"metrics": metrics, "state": state, "streamed": streamed}, Path(out) / "rank0.pt")


@pytest.mark.slow
def test_two_fsdp_ranks_with_lora_equal_one_process(make_cfg, tmp_path: Path) -> None:
    """2 gloo ranks (FSDP2 shards base and adapters): the same losses and merged weights as one
    process; their sharded checkpoint loads into one rank (resharded) to the same merged bits.
    Slow only for its two fresh processes' imports (about 40 s on two busy cores)."""
    import torch.multiprocessing as mp

    cfg = make_cfg(*LORA, "learner.lr=1e-2", "algorithm.kl_coef=0.05", "algorithm.old_logprobs=rollout",
                   "learner.micro_batch_size=2", "learner.global_batch_size=8")
    batches = [make_batch(seed=s, supervised=2) for s in range(2)]
    mp.spawn(_two_rank_worker, args=(_free_port(), cfg, batches, str(tmp_path)), nprocs=2, join=True)
    two = torch.load(tmp_path / "rank0.pt", weights_only=False)

    single = LearnerEngine(cfg)
    for got, batch in zip(two["metrics"], batches):
        one = single.train_step(batch)
        for key in ("loss", "pg_loss", "kl", "supervised_loss", "grad_norm", "tokens"):
            assert got[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    state = single.full_state_dict()
    assert two["state"].keys() == state.keys() and list(two["streamed"]) == list(single.param_shapes())
    assert max(float((two["state"][k] - state[k]).abs().max()) for k in state) < 1e-5
    assert all(torch.equal(two["streamed"][k], two["state"][k]) for k in two["streamed"])

    single.load_checkpoint(tmp_path / "ckpt", version=2)
    resharded = single.full_state_dict()
    assert all(torch.equal(resharded[k], two["state"][k]) for k in state)


def test_adapter_sync_needs_engines_that_serve_adapters_of_its_rank() -> None:
    """learner.lora.sync=adapter sends the adapter alone, so the policy engines must serve LoRA
    adapters at least as wide (inference.max_lora_rank)."""
    with pytest.raises(ConfigError, match=r"inference\.max_lora_rank=0.*learner\.lora\.rank=8"):
        load_config(None, ["learner.lora.rank=8", "learner.lora.sync=adapter"])
    with pytest.raises(ConfigError, match=r"inference\.max_lora_rank=1\b"):
        load_config(None, ["learner.lora.rank=8", "learner.lora.sync=adapter", "inference.max_lora_rank=1"])
    with pytest.raises(ConfigError, match=r"inference\.max_lora_rank=4 .*vLLM's ranks"):
        load_config(None, ["inference.max_lora_rank=4"])
    cfg = load_config(None, ["learner.lora.rank=8", "learner.lora.sync=adapter", "inference.max_lora_rank=16"])
    assert cfg.learner.lora.sync == "adapter"
