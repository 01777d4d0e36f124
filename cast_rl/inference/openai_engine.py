"""OpenAI-compatible backend (``inference.backend=openai``): a model served elsewhere over HTTP.

One :class:`OpenAIEngine` talks to ``inference.base_url`` (e.g. ``http://127.0.0.1:8000/v1`` of
``vllm serve``) with the ``openai`` package's ``AsyncOpenAI`` client, naming the model by the
path or name it was built with.

- :meth:`OpenAIEngine.chat` posts to ``/v1/chat/completions`` (tool definitions passed through)
  and returns the reply's text: all the LLM user simulator, the teacher and a model critic need.
- :meth:`OpenAIEngine.generate` posts the prompt as token ids to ``/v1/completions`` and asks
  for the sampled tokens' logprobs and ids (vLLM's ``return_token_ids``, or its
  ``return_tokens_as_token_ids`` logprob tokens ``"token_id:<id>"``).  A policy rollout needs the
  exact generated ids and their logprobs, so a server that returns neither raises
  :class:`OpenAIEndpointError`: serve the policy with vLLM's OpenAI server or the in-process vLLM
  backend.

The API key is read from the environment variable ``inference.api_key_env`` names (any non-empty
value for a local server without keys); it is never logged, put in an error message or shown by
``repr``.  A call longer than ``inference.request_timeout_s`` raises
:class:`~cast_rl.inference.base.GenerationTimeout`, retries included (the client retries a
failed connection or a 5xx answer twice, within that one timeout).
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path
from typing import Any

from cast_rl.config.schema import InferenceConfig
from cast_rl.inference.base import Completion, GenerationTimeout, Sampling
from cast_rl.models.chat import template_kwargs

_TOKEN_ID_PREFIX = "token_id:"
"""vLLM's logprob token strings under ``return_tokens_as_token_ids``."""


class OpenAIEndpointError(RuntimeError):
    """The endpoint answered, but not with what the caller needs (e.g. no token ids)."""


class OpenAIEngine:
    """An OpenAI-compatible endpoint serving one model, as an :class:`InferenceEngine`."""

    def __init__(self, model_path: str | Path, cfg: InferenceConfig) -> None:
        from openai import AsyncOpenAI

        if not cfg.base_url:
            raise ValueError(
                "inference.backend=openai needs inference.base_url (e.g. http://127.0.0.1:8000/v1)"
            )
        api_key = os.environ.get(cfg.api_key_env)
        if not api_key:
            raise ValueError(
                f"inference.backend=openai: environment variable {cfg.api_key_env} "
                "(inference.api_key_env) is not set; export the API key there (any non-empty "
                "value for a local server without keys)"
            )
        self.cfg = cfg
        self.model_path = str(model_path)
        """The model the requests name (the server's served model name: ``vllm serve <path>``
        serves it under the path)."""
        self._client = AsyncOpenAI(
            base_url=cfg.base_url, api_key=api_key, timeout=cfg.request_timeout_s, max_retries=2
        )
        self.generated_tokens = 0

    def __repr__(self) -> str:
        return f"OpenAIEngine(model={self.model_path!r}, base_url={self.cfg.base_url!r})"

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (chat template) when the model path is a local
        directory, loaded on first use; None for a model known only by its served name (chat
        needs no tokenizer; a policy does)."""
        if not Path(self.model_path).is_dir():
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_path)

    async def _call(self, what: str, request: Any) -> Any:
        from openai import APITimeoutError

        try:
            return await asyncio.wait_for(request, timeout=self.cfg.request_timeout_s)
        except (asyncio.TimeoutError, APITimeoutError):
            raise GenerationTimeout(
                f"{what} to {self.cfg.base_url} exceeded inference.request_timeout_s="
                f"{self.cfg.request_timeout_s}s"
            ) from None

    @staticmethod
    def _sampling_args(sampling: Sampling) -> dict[str, Any]:
        args: dict[str, Any] = {
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            args["seed"] = sampling.seed
        if sampling.stop:
            args["stop"] = list(sampling.stop)
        if sampling.regex:  # vLLM's OpenAI-compatible server: structured outputs in the extra body
            args["extra_body"] = {"structured_outputs": {"regex": sampling.regex}}
        if sampling.json_schema is not None:
            # (compact JSON is the server's own setting: vllm serve --structured-outputs-config
            # '{"backend": "xgrammar", "disable_any_whitespace": true}')
            args["extra_body"] = {"structured_outputs": {"json": sampling.json_schema}}
        return args

    def _model(self, sampling: Sampling) -> str:
        """The model a request names: a LoRA adapter by its served name (``vllm serve --lora-modules
        NAME=DIR``), else the base model."""
        return sampling.adapter or self.model_path

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: Sampling,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion:
        """The next assistant message's text (``/v1/chat/completions``); no token ids."""
        args = self._sampling_args(sampling)
        if tools:
            args["tools"] = tools
        if sampling.ignore_eos:
            args["extra_body"] = {**args.get("extra_body", {}), "ignore_eos": True}
        if self.cfg.thinking != "off":  # vLLM's server: the chat template's enable_thinking (off: the server's default)
            args["extra_body"] = {**args.get("extra_body", {}), "chat_template_kwargs": template_kwargs(self.cfg.thinking)}
        response = await self._call(
            "chat completion",
            self._client.chat.completions.create(model=self._model(sampling), messages=messages, **args),  # type: ignore[arg-type]
        )
        choice = response.choices[0]
        return Completion(
            text=choice.message.content or "",
            finish_reason="length" if choice.finish_reason == "length" else "stop",
            prompt_tokens=response.usage.prompt_tokens if response.usage else 0,
        )

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        """Continue the token ids ``prompt_ids`` (``/v1/completions``); returns the generated ids
        and, with ``sampling.logprobs``, their logprobs."""
        response = await self._call(
            "completion",
            self._client.completions.create(
                model=self._model(sampling),
                prompt=list(prompt_ids),
                logprobs=0 if sampling.logprobs else None,
                extra_body={
                    "return_token_ids": True,
                    "return_tokens_as_token_ids": True,
                    "skip_special_tokens": False,
                    "ignore_eos": sampling.ignore_eos,
                },
                **self._sampling_args(sampling),
            ),
        )
        choice = response.choices[0]
        ids = getattr(choice, "token_ids", None)
        lp = choice.logprobs
        if (
            ids is None
            and lp is not None
            and lp.tokens
            and all(t.startswith(_TOKEN_ID_PREFIX) for t in lp.tokens)
        ):
            ids = [int(t[len(_TOKEN_ID_PREFIX) :]) for t in lp.tokens]
        if ids is None:
            raise OpenAIEndpointError(
                f"{self.cfg.base_url} returned no token ids for a completion; a policy needs the "
                "exact generated ids (serve it with vLLM's OpenAI server, which returns them, or "
                "use inference.backend=vllm)"
            )
        ids = [int(i) for i in ids]
        logprobs: list[float] = []
        if sampling.logprobs:
            values = lp.token_logprobs if lp is not None else None
            if values is None or len(values) != len(ids) or any(v is None for v in values):
                raise OpenAIEndpointError(
                    f"{self.cfg.base_url} returned no logprob for every generated token "
                    f"({len(ids)} ids); a policy rollout needs them"
                )
            logprobs = [float(v) for v in values]
        self.generated_tokens += len(ids)
        return Completion(
            text=choice.text,
            token_ids=ids,
            logprobs=logprobs,
            finish_reason="length" if choice.finish_reason == "length" else "stop",
            prompt_tokens=response.usage.prompt_tokens if response.usage else len(prompt_ids),
        )

    def _no_weight_updates(self) -> OpenAIEndpointError:
        return OpenAIEndpointError(
            f"inference.backend=openai: the weights behind {self.cfg.base_url} are not updated by "
            "training; train the policy with inference.backend=vllm (an endpoint serves evaluation, "
            "the user, the teacher and a critic)"
        )

    async def load_weights(self, state: dict[str, Any]) -> None:
        """Refused: an endpoint's weights are the server's (see :meth:`_no_weight_updates`)."""
        raise self._no_weight_updates()

    async def join_weight_sync(self, *args: Any) -> list[int]:
        """Refused, like :meth:`load_weights`."""
        raise self._no_weight_updates()

    async def close(self) -> None:
        await self._client.close()
