"""Teacher collection: stage collect's episodes played by the teacher model, written for the policy.

With ``pipeline.collect_policy=teacher`` the training trajectories come from ``teacher.model``
(the paper: Qwen3-32B, ReAct, ``teacher.rollouts_per_task`` = 5 trials per task at
``teacher.collect_temperature`` = 0.7) instead of the policy.  The teacher runs in rollout workers
of its own (``actors.rollout_group.RolloutGroup(kind="teacher")``, each asking Ray for
``teacher.num_gpus``), never in the driver.

The teacher may not share the policy's tokenizer, so it never sees or writes policy token ids:
:class:`TeacherPolicy` (a :class:`~cast_rl.rollout.episode.Policy`) sends the episode's messages
through the teacher's own chat template, and writes its answer as the policy's canonical ids
(:meth:`cast_rl.rollout.tokens.ConversationTokens.encode_turn`, the path the scripted
demonstrations take too).  A trajectory is therefore laid out exactly like a policy rollout
(messages, the policy's ``token_ids`` and ``loss_mask``; zero logprobs, ``policy_version`` -1),
and the label, critic_data and optimise stages read it unchanged.  :func:`mark_teacher_trajectory`
says who played it.

ReAct (``teacher.react``): the teacher's system prompt asks for a short thought in a
``<think>`` block before each action.  A ``<think>`` block is what Qwen3 writes in thinking mode,
so one format serves both, and the runner already separates it from the action
(``teacher.inference.thinking``: ``keep`` leaves it in the message content, ``strip`` moves it to
``reasoning_content``); either way it is part of the ids the policy trains on, so the policy
learns to think before it acts.  A ``Thought:`` line in plain text would instead be sent to the
user as part of every reply.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.critique.teacher import build_teacher_engine
from cast_rl.inference.base import Completion, Sampling
from cast_rl.records import Trajectory
from cast_rl.rollout.episode import EpisodeState
from cast_rl.rollout.policy import ModelPolicy

REACT_NOTE = (
    "Before each action (a reply to the user or a tool call), think first: write one or two short "
    "sentences of reasoning inside <think></think>, then the reply or the tool call."
)
"""What ``teacher.react`` adds to the teacher's system prompt."""


def teacher_rollout_config(cfg: CastConfig) -> CastConfig:
    """The config the teacher's rollout workers run with: the teacher's engine settings
    (``teacher.inference`` at ``teacher.collect_temperature``: the runner samples with them and
    bounds context by them) and no critic in the loop; ``policy`` stays the policy, whose
    tokenizer writes the trajectories."""
    t = cfg.teacher
    return dataclasses.replace(
        cfg,
        inference=dataclasses.replace(t.inference, temperature=t.collect_temperature),
        critic=dataclasses.replace(cfg.critic, verification_budget=0),
    )


def mark_teacher_trajectory(traj: Trajectory, cfg: CastConfig) -> Trajectory:
    """``traj`` as the teacher's: ``policy_version`` -1 (no version of the policy produced it, as
    for demonstrations) and ``info["collected_by"]`` naming the teacher model."""
    traj.policy_version = -1
    traj.info["collected_by"] = f"teacher:{cfg.teacher.model.path}"
    return traj


def react_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with :data:`REACT_NOTE` at the end of the system prompt (one is added first
    when there is none)."""
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{REACT_NOTE}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": REACT_NOTE}, *messages]


class TeacherPolicy(ModelPolicy):
    """The policy a teacher rollout worker plays episodes with (see the module docstring).

    ``tokenizer`` is the policy's (the runner keeps the conversation's ids with it); ``engine``
    serves the teacher model and is asked by messages (real identifiers) only.
    """

    def __init__(self, engine: Any, tokenizer: Any, react: bool = True) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.react = react

    async def act(self, state: EpisodeState, sampling: Sampling) -> Completion:
        return state.conv.encode_turn((await self.chat(state.messages, sampling, state.conv.tools)).text)

    async def chat(
        self, messages: list[dict[str, Any]], sampling: Sampling, tools: list[dict[str, Any]] | None = None
    ) -> Completion:
        if self.react:
            messages = react_messages(messages)
        # the teacher's logprobs are of its own tokens: nothing the policy's learner can use
        return await self.engine.chat(messages, dataclasses.replace(sampling, logprobs=False), tools)

    async def close(self) -> None:
        await self.engine.close()


def build_teacher_policy(cfg: CastConfig, seed: int = 0) -> TeacherPolicy:
    """The teacher of ``cfg`` (``teacher.model`` served by ``teacher.inference``) with the policy's
    tokenizer (``policy.path``)."""
    from transformers import AutoTokenizer

    engine = build_teacher_engine(cfg.teacher, seed)  # the rationale rewrite's engine, too
    return TeacherPolicy(engine, AutoTokenizer.from_pretrained(cfg.policy.path), react=cfg.teacher.react)
