"""The episode runner: many multi-turn episodes in flight, played by one policy.

Each episode alternates policy turns, tool executions and user-simulator turns until the user
says ``###STOP###``, a terminate tool runs, or ``env.max_steps`` actions were taken.  Episodes
run as asyncio tasks (``rollout.episodes_in_flight`` at a time) so the engine's continuous
batching serves them together.  Bad model output is data: a malformed tool call becomes an error
observation and is counted; a hung generation, tool or user turn, or a critic service that
stays unreachable through its retries, ends that episode as a recorded failure
(``info["termination"]``), never the run.

With a :class:`~cast_rl.critique.verifier.Verifier` and ``critic.verification_budget`` B > 0,
each proposed action is critiqued before it runs; an ``invalid`` critique is shown to the policy
(a ``user`` message named ``critic``), which proposes again, up to B times.  Every round is
recorded and only the final action executes.

The runner knows no kind of policy: :func:`build_policy` turns what it is given (an inference
engine, or a :class:`~cast_rl.rollout.episode.Policy` such as a scripted expert) into the policy
once, and every turn is that policy's :meth:`~cast_rl.rollout.episode.Policy.act`.  Tree rollouts
(:mod:`cast_rl.rollout.tree`) and replays of recorded trajectories (:mod:`cast_rl.rollout.replay`)
build on the same loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.critique.service import CriticUnavailable
from cast_rl.critique.verifier import VerifyRequest
from cast_rl.envs.core import DomainData, Episode, StepTimeout
from cast_rl.envs.types import RESPOND, Action
from cast_rl.envs.users import build_user
from cast_rl.inference.base import (
    Completion,
    ContextOverflow,
    GenerationTimeout,
    InferenceEngine,
    Sampling,
)
from cast_rl.models.aliases import EntityAliases
from cast_rl.records import CRITIC_NAME, PolicyTurn, Trajectory, VerificationRound
from cast_rl.rollout.episode import EpisodeSpec, EpisodeState, Policy
from cast_rl.rollout.expert import GoldExpert
from cast_rl.rollout.policy import ModelPolicy, action_text
from cast_rl.rollout.replay import ReplayDiverged, replay
from cast_rl.rollout.tokens import ConversationTokens
from cast_rl.rollout.tree import run_tree, tree_points

__all__ = [
    "MALFORMED_HINT", "POLICY_BACKENDS", "EpisodeRunner", "EpisodeSpec", "EpisodeState", "Policy",
    "ReplayDiverged", "RunnerStats", "build_policy", "tree_points",
]

logger = logging.getLogger(__name__)

MALFORMED_HINT = 'Write exactly one call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'


@dataclass
class RunnerStats:
    """Counters a rollout worker reports as ``rollout/`` metrics, summed over the trajectories
    the runner recorded (:meth:`add`)."""

    episodes: int = 0
    policy_tokens: int = 0
    prompt_tokens: int = 0
    malformed_calls: int = 0
    extra_calls_dropped: int = 0
    critiques: int = 0
    inconsistent_token_episodes: int = 0
    terminations: dict[str, int] = field(default_factory=dict)

    def add(self, traj: Trajectory) -> None:
        self.episodes += 1
        self.policy_tokens += traj.policy_tokens
        self.prompt_tokens += traj.prompt_tokens
        self.malformed_calls += traj.malformed_calls
        self.extra_calls_dropped += traj.extra_calls_dropped
        self.critiques += sum(1 for t in traj.turns if t.verdict is not None)
        self.inconsistent_token_episodes += 0 if traj.info.get("tokens_consistent", True) else 1
        termination = traj.info.get("termination", "")
        self.terminations[termination] = self.terminations.get(termination, 0) + 1


POLICY_BACKENDS: dict[str, Callable[[Any], Policy]] = {
    "expert": lambda engine: GoldExpert(engine.tokenizer),
}
"""The ``inference.backend`` values whose engine only carries a tokenizer to a policy of their own
(every other backend's engine is the model: :class:`~cast_rl.rollout.policy.ModelPolicy`)."""


def build_policy(cfg: CastConfig, engine: InferenceEngine | Policy) -> Policy:
    """The policy a runner plays with: ``engine`` itself when it is a policy (a scripted expert,
    the teacher, a replay), else the policy ``inference.backend`` names for the engine."""
    if isinstance(engine, Policy):
        return engine
    return POLICY_BACKENDS.get(cfg.inference.backend, ModelPolicy)(engine)


class EpisodeRunner:
    """Runs episodes of one domain with one policy (plus an optional verifier).

    ``engine`` is an inference engine or a :class:`~cast_rl.rollout.episode.Policy`
    (:func:`build_policy`); it stays as given in :attr:`engine`, and :attr:`policy` plays.
    """

    def __init__(
        self,
        cfg: CastConfig,
        data: DomainData,
        engine: InferenceEngine | Policy,
        verifier: Any = None,
        policy_version: Callable[[], int] = lambda: 0,
        user_complete: Any = None,
    ) -> None:
        self.engine = engine
        self.policy = build_policy(cfg, engine)
        self.cfg = cfg
        self.data = data
        self.verifier = verifier
        self.budget = cfg.critic.verification_budget if verifier is not None else 0
        self.policy_version = policy_version
        self.user_complete = user_complete
        self.stats = RunnerStats()
        patterns = cfg.policy.entity_aliases
        self.aliases = EntityAliases(patterns) if patterns else None
        inf = cfg.inference
        self.sampling = Sampling(
            max_new_tokens=inf.max_new_tokens, temperature=inf.temperature, top_p=inf.top_p
        )

    @property
    def cfg(self) -> CastConfig:
        """The run's config, with the policy's step and context limits
        (:meth:`~cast_rl.rollout.episode.Policy.limits`: the gold-plan expert lifts them)."""
        return self._cfg

    @cfg.setter
    def cfg(self, cfg: CastConfig) -> None:
        self._cfg = self.policy.limits(cfg)

    def with_policy(self, policy: Policy, verifier: Any = None) -> EpisodeRunner:
        """A runner of the same run (config, domain, user, versions) played by ``policy``."""
        return EpisodeRunner(self.cfg, self.data, policy, verifier, self.policy_version, self.user_complete)

    async def run_many(
        self,
        specs: list[EpisodeSpec],
        on_done: Callable[[Trajectory], None] | None = None,
        concurrency: int | None = None,
    ) -> list[Trajectory]:
        """Run every spec, at most ``concurrency`` at a time; results in spec order."""
        limit = asyncio.Semaphore(concurrency or self.cfg.rollout.episodes_in_flight)

        async def one(spec: EpisodeSpec) -> Trajectory:
            async with limit:
                traj = await self.run(spec)
            if on_done is not None:
                on_done(traj)
            return traj

        return list(await asyncio.gather(*(one(s) for s in specs)))

    async def run(self, spec: EpisodeSpec, on_decision: Callable[[EpisodeState], None] | None = None) -> Trajectory:
        """One episode from reset to its end.

        ``on_decision`` is called with the live state at every decision point (just before each
        policy generation, revisions after a critique included); it may keep ``state.fork()``
        to branch from there later (tree rollouts, counterfactual credit).
        """
        state = self.new_state(spec)
        await self._advance(state, on_decision, reset=True)
        return self._record(state)

    def new_state(self, spec: EpisodeSpec) -> EpisodeState:
        """A fresh episode, not yet reset."""
        # A per-episode seed: reruns of a crashed worker's episodes sample the same way.
        seed = zlib.crc32(repr((self.cfg.seed, spec.key)).encode()) & 0x7FFFFFFF
        user = build_user(self.cfg.user, self.user_complete, seed=seed)
        policy = self.policy.for_episode(self.data, spec)
        episode = Episode(
            self.data, spec.split, spec.task_index, user, self.cfg.env.max_steps,
            self.cfg.env.tool_timeout_s,
        )
        return EpisodeState(
            spec=spec, episode=episode, policy=policy,
            conv=ConversationTokens(policy.tokenizer, self.data.tools, self.aliases, self.cfg.inference.thinking),
            sampling=replace(self.sampling, seed=seed), versions={self.policy_version()},
        )

    async def continue_from(
        self, state: EpisodeState, action: Action | None = None, seed: int | None = None,
        on_decision: Callable[[EpisodeState], None] | None = None,
    ) -> Trajectory:
        """Play a fork of ``state`` (a decision point) to the end with this runner's policy.

        With ``action``, that action takes the policy's place at the decision point: it runs
        unchecked, and its turn is recorded with ``substituted=True`` and loss mask 0.  ``seed``
        replaces the episode's sampling seed (distinct seeds give distinct continuations); with
        neither, a deterministic policy reproduces the original continuation exactly.  ``state``
        itself is left untouched, so one decision point serves any number of branches.
        """
        branch = state.fork()
        branch.started = time.perf_counter()
        if seed is not None:
            branch.sampling = replace(branch.sampling, seed=seed)
        if action is not None and await self._substitute(branch, action):  # it ended the episode
            branch.conv.finish()
        else:
            await self._advance(branch, on_decision)
        return self._record(branch)

    async def _substitute(self, state: EpisodeState, action: Action) -> bool:
        """Put ``action`` in the policy's place at ``state``'s decision point and run it
        unchecked; True when that ended the episode."""
        turn = state.conv.encode_turn(action_text(action))  # its canonical ids, end token included
        if len(state.conv) + len(turn.token_ids) > self.cfg.inference.max_model_len:
            state.termination = "context_overflow"
            return True
        message, _ = state.conv.add_policy_turn(Completion(text="", token_ids=turn.token_ids, logprobs=turn.logprobs))
        start, end = state.conv.last_span
        state.conv.loss_mask[start:end] = [0] * (end - start)  # not the policy's sample
        state.conv.policy_tokens -= end - start
        state.turns.append(PolicyTurn(len(state.conv.messages) - 1, start, end, action.to_json(), substituted=True))
        self._note_revision(state, action)
        state.round_index = 0
        return await self._guarded(state, self._take(state, action, message))

    async def run_tree(self, spec: EpisodeSpec, branches: int, points: str) -> list[Trajectory]:
        """An episode and ``branches - 1`` more continuations from each of its decision points
        named by ``points``, root first (:func:`cast_rl.rollout.tree.run_tree`)."""
        return await run_tree(self, spec, branches, points)

    async def replay(self, traj: Trajectory, message_index: int) -> EpisodeState:
        """The state at the decision point that produced ``traj.messages[message_index]``,
        reached by replaying ``traj``'s recorded prefix (:func:`cast_rl.rollout.replay.replay`);
        raises :class:`ReplayDiverged` when the episode answers otherwise."""
        return await replay(self, traj, message_index)

    async def _advance(
        self, state: EpisodeState, on_decision: Callable[[EpisodeState], None] | None = None, reset: bool = False,
    ) -> None:
        """Run ``state`` from where it stands to the end of the episode."""

        async def loop() -> None:
            if reset:
                first = await asyncio.wait_for(state.episode.reset(), self.cfg.user.timeout_s)
                state.conv.add_context(
                    [{"role": "system", "content": self.data.policy}, {"role": "user", "content": first}]
                )
            while state.steps < self.cfg.env.max_steps:
                action, message = await self._propose(state, on_decision)
                if action is None:
                    state.termination = message
                    return
                if await self._take(state, action, message):
                    return

        await self._guarded(state, loop())
        state.conv.finish()

    async def _guarded(self, state: EpisodeState, work: Any) -> bool:
        """Await ``work``; an episode-ending failure becomes ``state.termination`` (True)."""
        try:
            return bool(await work)
        except GenerationTimeout:
            state.termination = "generation_timeout"
        except ContextOverflow as exc:  # a teacher's own tokens outgrew its context
            logger.warning("episode %s: %s", state.spec.key, exc)
            state.termination = "context_overflow"
        except CriticUnavailable as exc:  # every retry and fail-over of the critic failed
            logger.warning("episode %s: %s", state.spec.key, exc)
            state.termination = "critic_unavailable"
        except StepTimeout as exc:
            state.termination = exc.reason
        except asyncio.TimeoutError:  # the user's opening message
            state.termination = "user_timeout"
        return True

    async def _take(self, state: EpisodeState, action: Action | str, message: dict[str, Any]) -> bool:
        """Run the decided action and add its observation; True when the episode ended."""
        state.steps += 1
        more = state.steps < self.cfg.env.max_steps  # else no generation prompt after this turn
        if isinstance(action, str):  # malformed: an error observation, counted
            error = {"role": "tool", "tool_call_id": "invalid", "content": action}
            state.conv.add_context([error], generation_prompt=more)
            return False
        # a hung tool or user ends the episode as a recorded tool_timeout / user_timeout
        result = await state.episode.step(action, self.cfg.env.tool_timeout_s, self.cfg.user.timeout_s)
        if action.name == RESPOND:
            reply = {"role": "user", "content": result.observation}
        else:
            call_id = message["tool_calls"][0]["id"]
            reply = {
                "role": "tool", "tool_call_id": call_id, "name": action.name,
                "content": result.observation,
            }
        state.conv.add_context([reply], generation_prompt=more and not result.done)
        if result.done:
            state.reward = float(result.reward)
            state.termination = "user_stop" if action.name == RESPOND else (
                "max_steps" if result.info.get("max_steps_reached") else "terminate_tool"
            )
        return bool(result.done)

    @staticmethod
    def _note_revision(state: EpisodeState, action: Action | str) -> None:
        """A turn that follows a rejected proposal is that proposal's revision."""
        rounds = state.rounds
        if rounds and rounds[-1].revision is None and rounds[-1].message_index < len(state.conv.messages) - 1:
            rounds[-1].revision = action.to_json() if isinstance(action, Action) else {"malformed": action}

    async def _propose(self, state: EpisodeState, on_decision: Callable[[EpisodeState], None] | None):
        """Generate an action, running critique-revise rounds; returns (action, message).

        The action is an :class:`Action`, an error-observation string for a malformed turn, or
        None (then ``message`` is the termination reason).
        """
        conv = state.conv
        while True:
            if len(conv) + self.sampling.max_new_tokens > self.cfg.inference.max_model_len:
                return None, "context_overflow"
            if on_decision is not None:
                on_decision(state)
            prompt_tokens = len(conv)
            completion = await self._generate(state)
            state.versions.add(self.policy_version())
            message, parsed = conv.add_policy_turn(completion)
            action = _to_action(parsed)
            turn = PolicyTurn(len(conv.messages) - 1, *conv.last_span,
                              action.to_json() if isinstance(action, Action) else None,
                              action if isinstance(action, str) else None,
                              prompt_tokens=prompt_tokens, dropped_calls=max(0, len(parsed.tool_calls) - 1))
            state.turns.append(turn)
            self._note_revision(state, action)
            if isinstance(action, str) or state.round_index >= self.budget or not self._in_scope(action):
                state.round_index = 0
                return action, message
            (critique,) = await self.verifier.verify([self._request(conv, action)])
            turn.verdict, turn.error_type = critique.verdict, critique.error_type
            if critique.verdict != "invalid":
                state.round_index = 0
                return action, message
            turn.executed = False
            state.rounds.append(VerificationRound(len(conv.messages) - 1, action.to_json(), critique.to_json()))
            conv.add_context([{"role": "user", "name": CRITIC_NAME, "content": critique.text}])
            state.round_index += 1

    def _in_scope(self, action: Action) -> bool:
        """Whether the critic checks this proposal (``critic.checks``)."""
        checks = self.cfg.critic.checks
        if checks == "tool_calls":
            return action.name != RESPOND
        if checks == "writes":
            return action.name in self.data.spec.write_tools
        return True

    @staticmethod
    async def _generate(state: EpisodeState) -> Completion:
        """The policy's next turn, sampled with the turn's own seed."""
        conv = state.conv
        sampling = state.sampling
        if sampling.seed is not None:
            # a seed per turn, from the episode's and the conversation's length: a revision after
            # a critique draws anew, and one turn of one episode draws the same numbers in every
            # configuration and rerun (configurations compare on common random numbers)
            sampling = replace(sampling, seed=zlib.crc32(repr((sampling.seed, len(conv.messages))).encode())
                               & 0x7FFFFFFF)
        return await state.policy.act(state, sampling)

    def _request(self, conv: ConversationTokens, action: Action) -> VerifyRequest:
        return VerifyRequest(
            domain=self.data.spec.name, policy=self.data.policy,
            messages=[dict(m) for m in conv.messages[:-1]], proposal=action.to_json(),
        )

    def _record(self, state: EpisodeState) -> Trajectory:
        conv, spec = state.conv, state.spec
        traj = Trajectory(
            domain=self.data.spec.name, split=spec.split, task_index=spec.task_index,
            trial=spec.trial, reward=state.reward, policy_version=min(state.versions),
            messages=conv.messages, token_ids=conv.token_ids, loss_mask=conv.loss_mask,
            logprobs=conv.logprobs,
            verification_rounds=list(state.rounds), turns=list(state.turns),
            info={
                "termination": state.termination,
                "policy_versions": sorted(state.versions),
                "tokens_consistent": conv.consistent,
                "wall_s": round(time.perf_counter() - state.started, 4),
            },
        )
        self.stats.add(traj)
        return traj


def _to_action(parsed: Any) -> Action | str:
    """The action a parsed turn stands for (its first call: the source runs one per turn), or an
    error observation for a malformed one."""
    if parsed.tool_calls:
        call = parsed.tool_calls[0]
        return Action(name=call["name"], kwargs=call["arguments"])
    if parsed.errors:
        return f"Error: malformed tool call: {'; '.join(parsed.errors)}. {MALFORMED_HINT}"
    if not parsed.content:
        return f"Error: empty response. Reply to the user or call a tool. {MALFORMED_HINT}"
    return Action(name=RESPOND, kwargs={"content": parsed.content})
