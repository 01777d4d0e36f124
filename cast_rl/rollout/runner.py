"""The episode runner: many multi-turn episodes in flight over one inference engine.

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
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.critique.service import CriticUnavailable
from cast_rl.envs.core import DomainData, Episode
from cast_rl.envs.types import RESPOND, Action
from cast_rl.envs.users import build_user
from cast_rl.inference.base import GenerationTimeout, InferenceEngine, Sampling
from cast_rl.rollout.tokens import ConversationTokens
from cast_rl.rollout.trajectory import CRITIC_NAME, PolicyTurn, Trajectory, VerificationRound

logger = logging.getLogger(__name__)

MALFORMED_HINT = 'Write exactly one call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to run: a task of a split, and the trial number."""

    split: str
    task_index: int
    trial: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.split, self.task_index, self.trial)


@dataclass
class RunnerStats:
    """Counters a rollout worker reports as ``rollout/`` metrics."""

    episodes: int = 0
    policy_tokens: int = 0
    prompt_tokens: int = 0
    malformed_calls: int = 0
    extra_calls_dropped: int = 0
    critiques: int = 0
    inconsistent_token_episodes: int = 0
    terminations: dict[str, int] = field(default_factory=dict)


class EpisodeRunner:
    """Runs episodes of one domain against one engine (plus an optional verifier)."""

    def __init__(
        self,
        cfg: CastConfig,
        data: DomainData,
        engine: InferenceEngine,
        verifier: Any = None,
        policy_version: Callable[[], int] = lambda: 0,
        user_complete: Any = None,
    ) -> None:
        self.cfg = cfg
        self.data = data
        self.engine = engine
        self.verifier = verifier
        self.budget = cfg.critic.verification_budget if verifier is not None else 0
        self.policy_version = policy_version
        self.user_complete = user_complete
        self.stats = RunnerStats()
        inf = cfg.inference
        self.sampling = Sampling(
            max_new_tokens=inf.max_new_tokens, temperature=inf.temperature, top_p=inf.top_p
        )

    @property
    def cfg(self) -> CastConfig:
        """The run's config; with ``inference.backend=expert`` its step and context limits are
        lifted (they bind a model, not the expert; see :mod:`cast_rl.rollout.expert`)."""
        return self._cfg

    @cfg.setter
    def cfg(self, cfg: CastConfig) -> None:
        if cfg.inference.backend == "expert":
            from cast_rl.rollout.expert import expert_limits

            cfg = expert_limits(cfg)
        self._cfg = cfg

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

    async def run(self, spec: EpisodeSpec) -> Trajectory:
        """One episode from reset to its end."""
        t0 = time.perf_counter()
        # A per-episode seed: reruns of a crashed worker's episodes sample the same way.
        seed = zlib.crc32(repr((self.cfg.seed, spec.key)).encode()) & 0x7FFFFFFF
        sampling = replace(self.sampling, seed=seed)
        user = build_user(self.cfg.user, self.user_complete, seed=seed)
        engine = self._episode_engine(spec)
        episode = Episode(
            self.data, spec.split, spec.task_index, user, self.cfg.env.max_steps,
            self.cfg.env.tool_timeout_s,
        )
        conv = ConversationTokens(engine.tokenizer, self.data.tools)
        versions = {self.policy_version()}
        rounds: list[VerificationRound] = []
        turns: list[PolicyTurn] = []
        counters = {"malformed_calls": 0, "extra_calls_dropped": 0, "prompt_tokens": 0}
        reward, termination = 0.0, "max_steps"
        try:
            first = await asyncio.wait_for(episode.reset(), self.cfg.user.timeout_s)
            conv.add_context([{"role": "system", "content": self.data.policy}, {"role": "user", "content": first}])
            steps = 0
            while steps < self.cfg.env.max_steps:
                action, message = await self._propose(engine, conv, sampling, spec, rounds, turns, counters, versions)
                if action is None:
                    termination = message
                    break
                steps += 1
                more = steps < self.cfg.env.max_steps  # else no generation prompt after this turn
                if isinstance(action, str):  # malformed: an error observation, counted
                    error = {"role": "tool", "tool_call_id": "invalid", "content": action}
                    conv.add_context([error], generation_prompt=more)
                    continue
                result = await self._execute(episode, action)
                if action.name == RESPOND:
                    reply = {"role": "user", "content": result.observation}
                else:
                    call_id = message["tool_calls"][0]["id"]
                    reply = {
                        "role": "tool", "tool_call_id": call_id, "name": action.name,
                        "content": result.observation,
                    }
                conv.add_context([reply], generation_prompt=more and not result.done)
                if result.done:
                    reward = float(result.reward)
                    termination = "user_stop" if action.name == RESPOND else (
                        "max_steps" if result.info.get("max_steps_reached") else "terminate_tool"
                    )
                    break
        except GenerationTimeout:
            termination = "generation_timeout"
        except CriticUnavailable as exc:  # every retry and fail-over of the critic failed
            logger.warning("episode %s: %s", spec.key, exc)
            termination = "critic_unavailable"
        except _StepTimeout as exc:
            termination = exc.reason
        except asyncio.TimeoutError:  # the user's opening message
            termination = "user_timeout"
        conv.finish()
        return self._record(spec, conv, reward, termination, rounds, turns, counters, versions, t0)

    def _episode_engine(self, spec: EpisodeSpec) -> Any:
        """The engine serving one episode: the shared one, or the task's own expert."""
        if self.cfg.inference.backend != "expert":
            return self.engine
        from cast_rl.rollout.expert import expert_engine

        return expert_engine(self.engine.tokenizer, self.data.task(spec.split, spec.task_index), self.data.spec)

    async def _propose(self, engine, conv, sampling, spec, rounds, turns, counters, versions):  # noqa: ANN001, ANN202
        """Generate an action, running critique-revise rounds; returns (action, message).

        The action is an :class:`Action`, an error-observation string for a malformed turn, or
        None (then ``message`` is the termination reason).
        """
        round_index = 0
        while True:
            if len(conv) + self.sampling.max_new_tokens > self.cfg.inference.max_model_len:
                return None, "context_overflow"
            counters["prompt_tokens"] += len(conv)
            completion = await engine.generate(conv.token_ids, sampling)
            versions.add(self.policy_version())
            message, parsed = conv.add_policy_turn(completion)
            action = _to_action(parsed, counters)
            turn = PolicyTurn(len(conv.messages) - 1, *conv.last_span,
                              action.to_json() if isinstance(action, Action) else None,
                              action if isinstance(action, str) else None)
            turns.append(turn)
            if rounds and rounds[-1].revision is None and rounds[-1].message_index < len(conv.messages) - 1:
                rounds[-1].revision = action.to_json() if isinstance(action, Action) else {"malformed": action}
            if isinstance(action, str) or round_index >= self.budget:
                return action, message
            (critique,) = await self.verifier.verify([self._request(conv, action)])
            self.stats.critiques += 1
            turn.verdict, turn.error_type = critique.verdict, critique.error_type
            if critique.verdict != "invalid":
                return action, message
            turn.executed = False
            rounds.append(VerificationRound(len(conv.messages) - 1, action.to_json(), critique.to_json()))
            conv.add_context([{"role": "user", "name": CRITIC_NAME, "content": critique.text}])
            round_index += 1

    async def _execute(self, episode: Episode, action: Action):  # noqa: ANN202
        """Run one action with its timeout: the user's turn, or the tool in a worker thread.

        A tool that hangs (pathological arguments) cannot be interrupted, but the episode stops
        waiting for it and ends as a recorded ``tool_timeout``; the thread works on this
        episode's private fork only.
        """
        if action.name == RESPOND:
            try:
                return await asyncio.wait_for(episode.step(action), self.cfg.user.timeout_s)
            except asyncio.TimeoutError:
                raise _StepTimeout("user_timeout") from None
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(episode.env.step, action), self.cfg.env.tool_timeout_s
            )
        except asyncio.TimeoutError:
            raise _StepTimeout("tool_timeout") from None

    def _request(self, conv: ConversationTokens, action: Action):  # noqa: ANN202
        from cast_rl.critique.verifier import VerifyRequest

        return VerifyRequest(
            domain=self.data.spec.name, policy=self.data.policy,
            messages=[dict(m) for m in conv.messages[:-1]], proposal=action.to_json(),
        )

    def _record(self, spec, conv, reward, termination, rounds, turns, counters, versions, t0) -> Trajectory:  # noqa: ANN001
        s = self.stats
        s.episodes += 1
        s.policy_tokens += conv.policy_tokens
        s.prompt_tokens += counters["prompt_tokens"]
        s.malformed_calls += counters["malformed_calls"]
        s.extra_calls_dropped += counters["extra_calls_dropped"]
        s.inconsistent_token_episodes += 0 if conv.consistent else 1
        s.terminations[termination] = s.terminations.get(termination, 0) + 1
        return Trajectory(
            domain=self.data.spec.name, split=spec.split, task_index=spec.task_index,
            trial=spec.trial, reward=reward, policy_version=min(versions),
            messages=conv.messages, token_ids=conv.token_ids, loss_mask=conv.loss_mask,
            logprobs=conv.logprobs,
            verification_rounds=[asdict(r) for r in rounds],
            turns=[asdict(t) for t in turns],
            info={
                "termination": termination,
                "policy_versions": sorted(versions),
                "policy_tokens": conv.policy_tokens,
                "prompt_tokens": counters["prompt_tokens"],
                "malformed_calls": counters["malformed_calls"],
                "extra_calls_dropped": counters["extra_calls_dropped"],
                "tokens_consistent": conv.consistent,
                "wall_s": round(time.perf_counter() - t0, 4),
            },
        )


class _StepTimeout(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _to_action(parsed: Any, counters: dict[str, int]) -> Action | str:
    """The action a parsed turn stands for, or an error observation for a malformed one."""
    if parsed.tool_calls:
        counters["extra_calls_dropped"] += len(parsed.tool_calls) - 1  # the source runs the first
        call = parsed.tool_calls[0]
        return Action(name=call["name"], kwargs=call["arguments"])
    if parsed.errors:
        counters["malformed_calls"] += 1
        return f"Error: malformed tool call: {'; '.join(parsed.errors)}. {MALFORMED_HINT}"
    if not parsed.content:
        counters["malformed_calls"] += 1
        return f"Error: empty response. Reply to the user or call a tool. {MALFORMED_HINT}"
    return Action(name=RESPOND, kwargs={"content": parsed.content})
