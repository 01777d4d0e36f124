"""Exact token bookkeeping for multi-turn episodes.

A conversation is kept as token ids that the learner can trust: the policy's generated ids are
appended verbatim (``loss_mask`` 1, engine logprobs), and everything else (system, user, tool,
critic turns and chat-template glue) is appended as the *difference* between two renderings of
the conversation by the tokenizer's own chat template (``loss_mask`` 0).  Two details other
systems get wrong:

* the template writes ``<|im_end|>\\n`` after every turn, but the policy stops at ``<|im_end|>``:
  the newline is appended as a context token before the next turn (and at the end), so no
  newline is lost at a turn boundary;
* a turn cut off by ``max_new_tokens`` gets its end-of-turn token appended (loss_mask 0).

Deltas always begin right after a special token, where byte-level BPE cannot merge across the
boundary, so encoding a delta equals the corresponding slice of encoding the whole text.  Then
``token_ids`` equals re-tokenising the final conversation whenever the policy's own tokens are the
canonical tokenisation of its text and its turn re-renders to the same text; :attr:`consistent`
says whether that held (it is reported as a rollout metric, never silently assumed).

With ``aliases`` (:mod:`cast_rl.models.aliases`) the conversation is rendered as the policy sees
it, identifiers replaced by per-conversation aliases, while ``messages`` keep the real ones: the
policy's turns are mapped back before they are parsed (a turn with an alias the table cannot map
back parses as malformed, so it runs nothing), and :meth:`encode_turn` writes a turn that a
scripted policy or a teacher wrote with real identifiers as the policy would
(:mod:`cast_rl.rollout.policy`); :meth:`env_prompt_ids` is the prompt with real identifiers.

``thinking`` (``inference.thinking``) reaches the chat template as ``enable_thinking`` on every
rendering, and decides where a turn's leading ``<think>...</think>`` goes: ``keep`` leaves it in the
message's content, ``strip`` moves it to ``reasoning_content`` (which the template writes back as
the same block, so the conversation still re-renders to its ids).  Either way the ids are the
ones sampled: the tokens the learner trains on are the tokens the policy wrote and was prompted
with.  A turn written by another model or a script (:meth:`encode_turn`) gets the policy
tokenizer's canonical ids, the one path by which teachers' turns become policy tokens.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any

from cast_rl.inference.base import Completion
from cast_rl.models.aliases import EntityAliases
from cast_rl.models.chat import (
    ParsedTurn,
    parse_assistant,
    split_thought,
    template_kwargs,
    thought_body,
)


class ConversationTokens:
    """Messages plus their token ids, loss mask and logprobs, built turn by turn."""

    def __init__(
        self, tokenizer: Any, tools: list[dict[str, Any]] | None, aliases: EntityAliases | None = None,
        thinking: str = "off",
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.aliases = aliases
        self.thinking = thinking
        """``inference.thinking`` (module docstring)."""
        self.messages: list[dict[str, Any]] = []
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.consistent = True
        """False once the policy sampled a non-canonical tokenisation of its text, or a turn did
        not re-render to the text it generated; then only the text, not every id, matches."""
        self._text = ""  # exactly the text that self.token_ids decode to
        self._eos_id: int = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self._newline_pending = False
        self._open_prompt = (0, 0)  # (tokens, chars) of a generation prompt not yet answered
        self.policy_tokens = 0
        self.last_span = (0, 0)
        """[start, end) in ``token_ids`` of the latest policy turn's generated ids."""
        self._rendered: str | None = ""  # render(self.messages) while known, else None
        self._prompt_suffix: str | None = None  # what add_generation_prompt appends

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool, shown: bool = True) -> str:
        """The chat template's text of ``messages``: as the policy sees them (aliases applied),
        or with ``shown=False`` as they are."""
        if shown and self.aliases is not None:
            messages = self.aliases.apply(messages)[0]
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt,
            **template_kwargs(self.thinking),
        )

    def policy_text(self, text: str) -> str:
        """``text`` written with real identifiers, as the policy would write it next."""
        if self.aliases is None:
            return text
        return self.aliases.to_policy(self.aliases.apply(self.messages)[1], text)

    def encode_turn(self, text: str) -> Completion:
        """A turn another model or a script wrote (real identifiers) as the policy would have
        written it: aliases applied, the policy tokenizer's canonical ids plus its end-of-turn
        token, no logprobs (zeros; it is no sample of the policy)."""
        text = self.policy_text(text)
        tok = self.tokenizer
        ids = [*tok(text, add_special_tokens=False).input_ids, tok.convert_tokens_to_ids(tok.eos_token)]
        return Completion(text=text, token_ids=ids, logprobs=[0.0] * len(ids))

    def env_prompt_ids(self) -> list[int]:
        """The prompt with real identifiers, as a reader of real identifiers would see it;
        without aliases it is ``token_ids``."""
        if self.aliases is None:
            return self.token_ids
        text = self._render(self.messages, generation_prompt=True, shown=False)
        return encode_context(self.tokenizer, text)

    def _generation_prompt(self, rendered: str) -> str:
        """The text the template appends for the assistant's turn.

        Rendered once per conversation (chat templates write a fixed assistant header; the
        first render checks that it extends the conversation) instead of a third full
        rendering on every turn.
        """
        if self._prompt_suffix is None:
            full = self._render(self.messages, generation_prompt=True)
            if not full.startswith(rendered):
                raise AssertionError("chat template's generation prompt rewrites the conversation")
            self._prompt_suffix = full[len(rendered) :]
        return self._prompt_suffix

    def _append_context_text(self, text: str) -> None:
        if not text:
            return
        ids = encode_context(self.tokenizer, text)
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self._text += text

    def add_context(self, new_messages: list[dict[str, Any]], generation_prompt: bool = True) -> None:
        """Append non-policy messages (and the assistant generation prompt) as context tokens."""
        before = self._rendered if self._rendered is not None else self._render(self.messages, generation_prompt=False)
        self.messages.extend(new_messages)
        after = self._render(self.messages, generation_prompt=False)
        self._rendered = after
        if self._newline_pending:  # the "\n" after the policy's <|im_end|>
            self._newline_pending = False
            if not before.endswith("\n"):
                raise AssertionError("chat template must end every turn with a newline")
            self._append_context_text("\n")
        if not after.startswith(before):
            raise AssertionError("chat template re-rendered earlier turns differently")
        if self._text != before and self.consistent:
            self.consistent = False
        self._append_context_text(after[len(before) :])
        if self.consistent and self._text != after:
            self.consistent = False
        if generation_prompt:
            prompt = self._generation_prompt(after)
            n = len(self.token_ids)
            self._append_context_text(prompt)
            self._open_prompt = (len(self.token_ids) - n, len(prompt))

    def add_policy_turn(self, completion: Completion) -> tuple[dict[str, Any], ParsedTurn]:
        """Append generated ids verbatim; returns the assistant message and its parse."""
        self._open_prompt = (0, 0)
        self._rendered = None
        ids, logprobs = list(completion.token_ids), list(completion.logprobs)
        if len(logprobs) != len(ids):
            logprobs = (logprobs + [0.0] * len(ids))[: len(ids)]
        self.last_span = (len(self.token_ids), len(self.token_ids) + len(ids))
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.policy_tokens += len(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        self._text += text
        body = ids[:-1] if ids and ids[-1] == self._eos_id else ids
        if self.consistent and self.tokenizer(text, add_special_tokens=False).input_ids[: len(body)] != body:
            self.consistent = False  # sampled a non-canonical tokenisation of its own text
        eos = self.tokenizer.eos_token
        if not ids or ids[-1] != self._eos_id:  # cut off by max_new_tokens: close the turn
            self.token_ids.append(self._eos_id)
            self.loss_mask.append(0)
            self.logprobs.append(0.0)
            self._text += eos
        else:
            text = text[: -len(eos)]
        unmapped: list[str] = []
        if self.aliases is not None:  # the policy wrote aliases: the message holds what they name
            table = self.aliases.apply(self.messages)[1]
            unmapped = self.aliases.unmapped(table, text)
            text = self.aliases.to_real(table, text)
        thought, answer = split_thought(text) if self.thinking != "off" else ("", text)
        parsed = parse_assistant(answer)  # a call inside a thought runs nothing
        if unmapped:  # an alias that names nothing: an error observation, never a tool argument
            parsed = ParsedTurn(content=answer, errors=[unmapped_alias_error(unmapped)])
        if self.thinking == "strip" and thought_body(thought):  # the template writes it back as generated
            message = {**assistant_message(parsed, raw_text=answer, turn=len(self.messages)),
                       "reasoning_content": thought_body(thought)}
        else:
            message = assistant_message(parsed, raw_text=answer, turn=len(self.messages), thought=thought)
        self.messages.append(message)
        self._newline_pending = True
        return message, parsed

    def finish(self) -> None:
        """Close the conversation: the final "\\n" after the last turn, no dangling prompt."""
        n_tokens, n_chars = self._open_prompt
        if n_tokens:  # the episode ended before the policy answered the last prompt
            del self.token_ids[-n_tokens:], self.loss_mask[-n_tokens:], self.logprobs[-n_tokens:]
            self._text = self._text[:-n_chars]
            self._open_prompt = (0, 0)
        if self._newline_pending:
            self._newline_pending = False
            self._append_context_text("\n")
        if self.consistent:
            if self._rendered is None:
                self._rendered = self._render(self.messages, generation_prompt=False)
            if self._text != self._rendered:
                self.consistent = False

    def fork(self) -> ConversationTokens:
        """An independent copy (the tokenizer is shared)."""
        child = copy.copy(self)
        child.messages = list(self.messages)
        child.token_ids, child.loss_mask, child.logprobs = list(self.token_ids), list(self.loss_mask), list(self.logprobs)
        return child

    def __len__(self) -> int:
        return len(self.token_ids)


def unmapped_alias_error(aliases: list[str]) -> str:
    """Why a turn that writes aliases its conversation never introduced cannot run."""
    return (f"{', '.join(aliases)} {'is not an alias' if len(aliases) == 1 else 'are not aliases'} "
            "of this conversation; name only identifiers it has shown")


def assistant_message(parsed: ParsedTurn, raw_text: str, turn: int, thought: str = "") -> dict[str, Any]:
    """The OpenAI-style assistant message for a generated turn.

    Well-formed calls become ``tool_calls`` (arguments as the JSON string the chat template
    writes back); a turn with malformed markup keeps its raw text as content so that it
    re-renders to what the policy wrote.  ``thought``: the ``<think>`` block written before
    ``raw_text`` (``inference.thinking=keep``), kept at the start of the content.
    """
    if parsed.errors or not parsed.tool_calls:
        return {"role": "assistant", "content": thought + raw_text}
    # The template writes content, a newline, then the calls: keep the raw prefix so that a
    # canonically formatted turn re-renders byte for byte.
    prefix = thought + raw_text[: raw_text.index("<tool_call>")]
    message: dict[str, Any] = {"role": "assistant", "content": prefix.removesuffix("\n")}
    if parsed.tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{turn}_{i}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call["arguments"], ensure_ascii=False),
                },
            }
            for i, call in enumerate(parsed.tool_calls)
        ]
    return message


_CACHED_CHARS = 512
"""Context segments at least this long (the system prompt with its tool schemas, which every
episode of a domain starts with) are encoded once per process and looked up after that."""


def encode_context(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer(text, add_special_tokens=False).input_ids``, without re-encoding long repeats.

    The text is cut at the tokenizer's special tokens, which the tokenizer splits out before
    its pre-tokenizer and model see the text, so no token spans a cut and the pieces' ids
    concatenate to the whole text's ids.  Long pieces come from a small per-process cache.
    """
    pattern = _special_split(tokenizer)
    if pattern is None:
        return tokenizer(text, add_special_tokens=False).input_ids
    ids: list[int] = []
    for piece in pattern.split(text):
        if not piece:
            continue
        if len(piece) >= _CACHED_CHARS:
            ids += _encode_cached(tokenizer, piece)
        else:
            ids += tokenizer(piece, add_special_tokens=False).input_ids
    return ids


@functools.lru_cache(maxsize=64)
def _encode_cached(tokenizer: Any, piece: str) -> tuple[int, ...]:
    return tuple(tokenizer(piece, add_special_tokens=False).input_ids)


@functools.lru_cache(maxsize=16)
def _special_split(tokenizer: Any) -> re.Pattern[str] | None:
    """A pattern that splits text around the special tokens the tokenizer cuts out verbatim.

    None (encode whole texts) when any special token strips the whitespace beside it or is
    normalised, where a cut would not match the tokenizer's own split.
    """
    added = getattr(tokenizer, "added_tokens_decoder", None)
    if not added:
        return None
    specials = [t for t in added.values() if t.special]
    if not specials or any(t.lstrip or t.rstrip or t.normalized for t in specials):
        return None
    contents = sorted((t.content for t in specials), key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(c) for c in contents) + ")")
