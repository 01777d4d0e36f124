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
import contextlib
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.critique.service import CriticUnavailable
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
from cast_rl.rollout.tokens import ConversationTokens

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


@dataclass
class EpisodeState:
    """An episode between two steps: the environment and user, the policy's engine, the token
    conversation and everything recorded so far.  At a decision point (``on_decision`` of
    :meth:`EpisodeRunner.run`) it is the exact state before the policy's next turn; :meth:`fork`
    copies it in microseconds (copy-on-write database, copied user state) so that any number of
    continuations can start there."""

    spec: EpisodeSpec
    episode: Episode
    engine: Any
    conv: ConversationTokens
    sampling: Sampling
    versions: set[int]
    rounds: list[VerificationRound] = field(default_factory=list)
    turns: list[PolicyTurn] = field(default_factory=list)
    steps: int = 0
    """Actions taken (tool calls, messages to the user, malformed turns)."""
    round_index: int = 0
    """Critique rounds spent on the pending decision."""
    reward: float = 0.0
    termination: str = "max_steps"
    started: float = field(default_factory=time.perf_counter)

    @property
    def message_index(self) -> int:
        """Index the policy's next message will have."""
        return len(self.conv.messages)

    def fork(self) -> EpisodeState:
        """An independent copy: steps on either side are invisible to the other."""
        fork_engine = getattr(self.engine, "fork", None)
        return replace(
            self, episode=self.episode.fork(), engine=fork_engine() if fork_engine else self.engine,
            conv=self.conv.fork(), versions=set(self.versions),
            rounds=[replace(r) for r in self.rounds], turns=[replace(t) for t in self.turns],
        )


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
        patterns = cfg.policy.entity_aliases
        self.aliases = EntityAliases(patterns) if patterns else None
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
        engine = self._episode_engine(spec)
        episode = Episode(
            self.data, spec.split, spec.task_index, user, self.cfg.env.max_steps,
            self.cfg.env.tool_timeout_s,
        )
        return EpisodeState(
            spec=spec, episode=episode, engine=engine,
            conv=ConversationTokens(engine.tokenizer, self.data.tools, self.aliases, self.cfg.inference.thinking),
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
        ids = self._substitute_ids(state.conv, action)
        if len(state.conv) + len(ids) > self.cfg.inference.max_model_len:
            state.termination = "context_overflow"
            return True
        message, _ = state.conv.add_policy_turn(Completion(text="", token_ids=ids, logprobs=[0.0] * len(ids)))
        start, end = state.conv.last_span
        state.conv.loss_mask[start:end] = [0] * (end - start)  # not the policy's sample
        state.conv.policy_tokens -= end - start
        state.turns.append(PolicyTurn(len(state.conv.messages) - 1, start, end, action.to_json(), substituted=True))
        self._note_revision(state, action)
        state.round_index = 0
        return await self._guarded(state, self._take(state, action, message))

    async def run_tree(self, spec: EpisodeSpec, branches: int, points: str) -> list[Trajectory]:
        """An episode and ``branches - 1`` more continuations from each of its decision points
        named by ``points`` (writes, flagged, all: see :func:`tree_points`), root first.

        The root's ``info["tree"]`` lists the points; each continuation's names its ``point``,
        ``branch`` (1..K-1) and ``env_steps`` (actions after the point: what it cost beyond the
        shared prefix).  Continuations sample with seeds of their own, so a stochastic policy
        explores from the very state the root was in.
        """
        snapshots: dict[int, EpisodeState] = {}
        root = await self.run(spec, on_decision=partial(_keep_first, snapshots))
        chosen = [p for p in tree_points(root, points, self.data.spec.write_tools) if p in snapshots]
        root.info["tree"] = {"points": chosen, "env_steps": env_steps(root)}

        async def grow(point: int, branch: int) -> Trajectory:
            seed = zlib.crc32(repr(("tree", self.cfg.seed, spec.key, point, branch)).encode()) & 0x7FFFFFFF
            state = snapshots[point]
            traj = await self.continue_from(state, seed=seed)
            traj.info["tree"] = {"point": point, "branch": branch,
                                 "env_steps": env_steps(traj) - state.steps}
            return traj

        grown = await asyncio.gather(*(grow(p, b) for p in chosen for b in range(1, branches)))
        return [root, *grown]

    async def replay(self, traj: Trajectory, message_index: int) -> EpisodeState:
        """Reset ``traj``'s episode and replay its recorded prefix up to the decision point that
        produced ``messages[message_index]`` (an assistant message): the slow way to the state
        that a snapshot's :meth:`EpisodeState.fork` gives at once.

        The recorded policy turns (their exact token ids) and critiques are fed back through the
        same loop that ran the episode, so tools, the user and the token bookkeeping act as they
        did.  Raises :class:`ReplayDiverged` when the environment or the user answers otherwise
        (a user that is not deterministic for the episode's seed).  A stateful per-episode engine
        (the gold-plan expert) starts fresh.
        """
        if not (0 < message_index < len(traj.messages)) or traj.messages[message_index]["role"] != "assistant":
            raise ValueError(f"message_index={message_index} is not an assistant message of the trajectory")
        if not traj.turns:
            raise ValueError("the trajectory has no recorded turns (written before turns were recorded); "
                             "it cannot be replayed")
        spec = EpisodeSpec(traj.split, traj.task_index, traj.trial)
        recorded = _Recorded(traj, self.engine.tokenizer if self.engine is not None else None)
        runner = EpisodeRunner(self.cfg, self.data, recorded, recorded if recorded.checked else None,
                               self.policy_version, self.user_complete)
        if recorded.checked:  # every recorded critique is served, an unchecked turn stays so
            runner.budget = 1 << 30
        state = runner.new_state(spec)
        state.engine = recorded
        reached: list[EpisodeState] = []

        def stop_at(s: EpisodeState) -> None:
            if len(s.conv.messages) == message_index:
                reached.append(s)
                raise _Reached

        with contextlib.suppress(_Reached):
            await runner._advance(state, stop_at, reset=True)
        if not reached:
            raise ReplayDiverged(f"episode {spec.key}: the replay ended ({state.termination}) before message {message_index}")
        if state.conv.messages != traj.messages[:message_index]:
            first = next(i for i, (a, b) in enumerate(zip(state.conv.messages, traj.messages)) if a != b)
            raise ReplayDiverged(f"episode {spec.key}: message {first} differs on replay "
                                 f"({state.conv.messages[first]!r} != {traj.messages[first]!r})")
        state.engine = self._episode_engine(spec)
        return state

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

    def _substitute_ids(self, conv: ConversationTokens, action: Action) -> list[int]:
        """The canonical token ids of ``action`` written as a policy turn (end token included)."""
        from cast_rl.rollout.expert import tool_call_text

        text = action.kwargs.get("content", "") if action.name == RESPOND else tool_call_text(action.name, action.kwargs)
        text = conv.policy_text(text)
        tok = conv.tokenizer
        return [*tok(text, add_special_tokens=False).input_ids, tok.convert_tokens_to_ids(tok.eos_token)]

    @staticmethod
    def _note_revision(state: EpisodeState, action: Action | str) -> None:
        """A turn that follows a rejected proposal is that proposal's revision."""
        rounds = state.rounds
        if rounds and rounds[-1].revision is None and rounds[-1].message_index < len(state.conv.messages) - 1:
            rounds[-1].revision = action.to_json() if isinstance(action, Action) else {"malformed": action}

    def _episode_engine(self, spec: EpisodeSpec) -> Any:
        """The engine serving one episode: the shared one, or the task's own expert."""
        if self.cfg.inference.backend != "expert":
            return self.engine
        from cast_rl.rollout.expert import expert_engine

        return expert_engine(self.engine.tokenizer, self.data.task(spec.split, spec.task_index), self.data.spec)

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
            if isinstance(action, str) or state.round_index >= self.budget:
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

    @staticmethod
    async def _generate(state: EpisodeState) -> Completion:
        """The engine's next turn.  A scripted teacher (``writes_real_ids``) reads the prompt
        with real identifiers, and its turn is written as the policy would write it (aliases);
        a model teacher (``reads_messages``, :mod:`cast_rl.rollout.teacher`) reads the messages
        through its own chat template, and its text becomes the policy tokenizer's ids."""
        conv, engine = state.conv, state.engine
        sampling = state.sampling
        if sampling.seed is not None:
            # a seed per turn, from the episode's and the conversation's length: a revision after
            # a critique draws anew, and one turn of one episode draws the same numbers in every
            # configuration and rerun (configurations compare on common random numbers)
            sampling = replace(sampling, seed=zlib.crc32(repr((sampling.seed, len(conv.messages))).encode())
                               & 0x7FFFFFFF)
        if getattr(engine, "reads_messages", False):
            return conv.encode_turn((await engine.chat(conv.messages, sampling, conv.tools)).text)
        if conv.aliases is None or not getattr(engine, "writes_real_ids", False):
            return await engine.generate(conv.token_ids, sampling)
        return conv.encode_turn((await engine.generate(conv.env_prompt_ids(), sampling)).text)

    def _request(self, conv: ConversationTokens, action: Action):  # noqa: ANN202
        from cast_rl.critique.verifier import VerifyRequest

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


def _keep_first(snapshots: dict[int, EpisodeState], state: EpisodeState) -> None:
    if state.message_index not in snapshots:
        snapshots[state.message_index] = state.fork()


def env_steps(traj: Trajectory) -> int:
    """Actions the episode took (tool calls, replies, malformed turns): its environment steps."""
    return sum(1 for t in traj.turns if t.executed)


def tree_points(traj: Trajectory, points: str, write_tools: frozenset[str] | set[str]) -> list[int]:
    """Message indices of the decision points to branch from: before each write that ran
    (``writes``), before each decision whose first proposal the critic rejected (``flagged``),
    or before every turn that ran (``all``)."""
    turns = traj.turns
    if points == "writes":
        return [t.message_index for t in turns if t.executed and t.action and t.action["name"] in write_tools]
    if points == "flagged":
        out, previous_rejected = [], False
        for t in turns:
            if not t.executed and not previous_rejected:
                out.append(t.message_index)
            previous_rejected = not t.executed
        return out
    if points == "all":
        return [t.message_index for t in turns if t.executed]
    raise ValueError(f"tree points {points!r} is not allowed; choose writes, flagged or all")


class ReplayDiverged(RuntimeError):
    """A replayed prefix did not reproduce the recorded episode."""


class _Reached(Exception):
    """The replay reached its decision point."""


class _Recorded:
    """Engine and verifier in one: answers a replay with a trajectory's recorded turns and
    critiques, turn by turn (see :meth:`EpisodeRunner.replay`)."""

    def __init__(self, traj: Trajectory, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._traj = traj
        self._turns = traj.turns
        self._rejections = iter(r.critique for r in traj.verification_rounds)
        self._next = 0
        self.checked = any(t.verdict is not None for t in self._turns)

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        if self._next >= len(self._turns):
            raise ReplayDiverged("the replay asked for more policy turns than were recorded")
        t = self._turns[self._next]
        self._next += 1
        return Completion(text="", token_ids=self._traj.token_ids[t.start:t.end],
                          logprobs=self._traj.logprobs[t.start:t.end])

    async def verify(self, requests: list[Any]) -> list[Any]:
        """The recorded critique of the turn just served; a turn the critic never saw gets a
        verdict of None, which the runner treats as unchecked."""
        from cast_rl.critique.verifier import Critique

        t = self._turns[self._next - 1]
        if t.verdict is None:
            return [Critique(verdict=None, error_type=None)]  # type: ignore[arg-type]
        if t.executed:
            return [Critique(verdict=t.verdict, error_type=t.error_type or "none")]
        return [Critique(**next(self._rejections))]


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
