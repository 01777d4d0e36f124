"""bf16 where the config says so: ``policy.dtype=bfloat16`` makes the FSDP2 learner compute in bf16
over float32 master weights (one step on the CPU), and the collective sync sends bf16."""

from __future__ import annotations

import pytest
import torch

from cast_rl.learner.engine import LearnerEngine, compute_dtype
from cast_rl.learner.nccl_sync import plan_for


def test_bf16_learner_step_keeps_fp32_master_weights(make_cfg) -> None:
    from test_learner_engine import make_batch

    bf16 = LearnerEngine(make_cfg("policy.dtype=bfloat16", "learner.lr=1e-2", "algorithm.old_logprobs=rollout"))
    fp32 = LearnerEngine(make_cfg("learner.lr=1e-2", "algorithm.old_logprobs=rollout"))
    assert compute_dtype(bf16.cfg) == torch.bfloat16 and compute_dtype(fp32.cfg) == torch.float32
    batch = make_batch(8, seed=3, supervised=8)
    before = {k: v.clone() for k, v in bf16.full_state_dict().items()}

    # the forward really runs in bf16: FSDP casts the gathered parameters for compute
    seen: list[torch.dtype] = []
    layer = bf16.model.model.layers[0].mlp.down_proj
    hook = layer.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    out16 = bf16.train_step(batch)
    hook.remove()
    out32 = fp32.train_step(batch)
    assert seen and set(seen) == {torch.bfloat16}

    # master weights and optimizer state stay float32, and they moved
    after = bf16.full_state_dict()
    assert {v.dtype for v in after.values()} == {torch.float32}
    assert all(s.dtype == torch.float32 for st in bf16.optimizer.state.values() for s in st.values()
               if torch.is_tensor(s) and s.dim() > 0)
    assert max(float((after[k] - before[k]).abs().max()) for k in after) > 1e-4
    # same loss as fp32 up to bf16 rounding, finite gradients
    assert out16["supervised_loss"] == pytest.approx(out32["supervised_loss"], rel=2e-2)
    assert torch.isfinite(torch.tensor(out16["grad_norm"])) and out16["grad_norm"] > 0

    # the engines get bf16: the sync plan casts floating tensors to the served dtype
    meta = plan_for(1, bf16.param_shapes(), 1 << 20, torch.bfloat16)
    assert {e[1] for b in meta.buckets for e in b.entries} == {"bfloat16"}
    fp32_meta = plan_for(1, fp32.param_shapes(), 1 << 20)
    assert meta.nbytes < 0.6 * fp32_meta.nbytes
