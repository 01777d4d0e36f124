"""A rollout worker: one policy engine, one domain's environments at a time, an optional verifier.

Plain library object; :mod:`actors.rollout_worker` is its Ray shell.  ``collect`` runs episodes
concurrently through :class:`~cast_rl.rollout.runner.EpisodeRunner`; ``update_weights`` swaps the
policy weights in place under a new version, pausing generation while it does so: full weights,
or, from a learner with ``learner.lora``, the policy's LoRA adapter alone
(:class:`~cast_rl.inference.adapters.AdapterUpdate`), after which every policy request runs with
that adapter; ``set_domain`` moves later episodes to another domain on the same engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import torch

from cast_rl.config.schema import CastConfig, CriticConfig
from cast_rl.critique.blame import BlameRecord, verify_blame
from cast_rl.critique.service import critic_description
from cast_rl.critique.verifier import GuardedVerifier
from cast_rl.envs.core import DomainData
from cast_rl.inference.adapters import AdapterUpdate
from cast_rl.inference.base import Completion, InferenceEngine, Sampling
from cast_rl.inference.weight_sync import (
    WeightSyncError,
    checkpoint_tensors,
    same_model,
    state_checksum,
)
from cast_rl.models.chat import check_appends_only
from cast_rl.records import Trajectory
from cast_rl.rollout.collector import Tree, Unit
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec, Policy
from cast_rl.rollout.verifiers import ConnectCritic, build_verifier

logger = logging.getLogger(__name__)

_PROBE = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


class PausableEngine:
    """Wraps an engine so that generation waits while the worker is paused (weight updates), and
    policy requests run with the policy's adapter once one is served (:attr:`adapter`)."""

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.adapter: str | None = None
        """The adapter policy requests run with (None: the engine's own weights)."""
        self._running = asyncio.Event()
        self._running.set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        await self._running.wait()
        self._in_flight += 1
        self._idle.clear()
        try:
            return await self.engine.generate(prompt_ids, self._with_adapter(sampling))
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def chat(
        self, messages: list[dict[str, Any]], sampling: Sampling, tools: list[dict[str, Any]] | None = None
    ) -> Completion:
        await self._running.wait()
        return await self.engine.chat(messages, self._with_adapter(sampling), tools)

    def _with_adapter(self, sampling: Sampling) -> Sampling:
        return replace(sampling, adapter=self.adapter) if self.adapter and sampling.adapter is None else sampling

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def drained(self) -> None:
        await self._idle.wait()


class RolloutWorker:
    """Collects trajectories for (split, task_index, trial) units with versioned weights."""

    def __init__(
        self,
        cfg: CastConfig,
        data: DomainData,
        engine: InferenceEngine,
        verifier: Any = None,
        worker_index: int = 0,
        connect_critic: ConnectCritic | None = None,
    ) -> None:
        self.cfg = cfg
        self.connect_critic = connect_critic
        """How a later critic switch reaches the critic-service actors (see :func:`build_verifier`)."""
        self.worker_index = worker_index
        if getattr(engine, "tokenizer", None) is not None:  # unit tests' stand-ins carry none
            # before any episode: a template that rewrites earlier turns would fail mid-episode
            check_appends_only(engine.tokenizer, cfg.inference.thinking, name=cfg.policy.path)
        self.engine = PausableEngine(engine)
        self.plays: InferenceEngine | Policy = engine if isinstance(engine, Policy) else self.engine
        """What the runner plays with: the pausable engine, or a policy given as such (a scripted
        one, the teacher), which no weight update touches."""
        self.version = 0
        self.checksum: str | None = None
        """Checksum of the learner state last loaded (None: the weights the engine started with)."""
        self.critic_counts: Counter[str] = Counter()
        """Critic answers and unparsable ones, over every critic this worker consulted."""
        self.runner = EpisodeRunner(cfg, data, self.plays, self._guard(verifier), policy_version=lambda: self.version)
        self._busy_s = 0.0
        self.last_sync_s: dict[str, float] = {}
        """Seconds the last update spent in the greedy probe and in receiving and loading (empty
        before one)."""
        self._served_probe: tuple[str | None, list[float]] | None = None
        """The greedy probe taken after the last update that landed, with the adapter it ran
        with: the next update's "before" (only updates change the served weights), so an update
        generates one probe, not two.  None until an update lands, and again after one fails."""

    async def collect(self, units: list[Unit], tree: Tree | None = None) -> list[Trajectory]:
        """Run one episode per (split, task_index, trial); results in the order given.

        With ``tree = (branches, points)`` each unit is a tree rollout
        (:meth:`~cast_rl.rollout.runner.EpisodeRunner.run_tree`): its root, then its continuations.
        """
        t0 = time.perf_counter()
        specs = [EpisodeSpec(split, index, trial) for split, index, trial in units]
        try:
            if tree is None:
                return await self.runner.run_many(specs)
            limit = asyncio.Semaphore(max(1, self.cfg.rollout.episodes_in_flight // tree[0]))

            async def one(spec: EpisodeSpec) -> list[Trajectory]:
                async with limit:
                    return await self.runner.run_tree(spec, *tree)

            return [t for grown in await asyncio.gather(*(one(s) for s in specs)) for t in grown]
        finally:
            self._busy_s += time.perf_counter() - t0

    async def blame(self, trajectories: dict[int, Trajectory], labels: list[dict[str, Any]], k: int,
                    seed: int) -> list[BlameRecord]:
        """Verified blame (:func:`cast_rl.critique.blame.verify_blame`) of these trajectories'
        labels, continuing with this worker's policy and critic settings."""
        t0 = time.perf_counter()
        try:
            return await verify_blame(self.runner.data, trajectories, labels, lambda _: self.runner, k, seed)
        finally:
            self._busy_s += time.perf_counter() - t0

    def can_load_policy(self, path: str) -> bool:
        """Whether :meth:`load_policy` can serve ``path`` on the running engine: an engine that
        loads weights, playing the policy itself with no adapter, and a checkpoint with the served
        model's architecture, sizes and tokenizer (:func:`~cast_rl.inference.weight_sync.same_model`)."""
        engine = self.engine.engine
        served = getattr(engine, "model_path", None)
        return (self.plays is self.engine and self.engine.adapter is None and served is not None
                and hasattr(engine, "load_weights") and same_model(served, path))

    async def load_policy(self, path: str) -> str:
        """Serve the checkpoint in ``path`` as a restart on it would, without restarting: its
        tensors load into the running engine (through :meth:`swap`, so the greedy probe must move
        unless they equal the weights served), the version starts again at 0 and ``path``
        becomes the checkpoint the engine started from.  Only where :meth:`can_load_policy`."""
        if not self.can_load_policy(path):
            raise ValueError(f"cannot load {path} in place on this worker: another architecture or tokenizer "
                             "than the served model's, an adapter served, or a policy that is not the engine")
        engine = self.engine.engine
        state = checkpoint_tensors(path)
        checksum = state_checksum(state)

        async def load() -> str:
            await engine.load_weights(state)
            return checksum

        await self.swap(0, load, lambda _: self._equals_started_checkpoint(state))
        engine.model_path = str(path)
        self.checksum = None  # what the engine "started from" is now path's checkpoint
        return checksum

    async def update_weights(self, version: int, weights: dict[str, Any] | AdapterUpdate, checksum: str) -> int:
        """Load new weights in place; refuses stale versions and corrupted payloads.  ``weights`` is
        a full state dict, or the policy's adapter alone (:meth:`_update_adapter`)."""
        if version <= self.version:
            raise WeightSyncError(f"refusing weights version {version}: worker already serves {self.version}")
        if isinstance(weights, AdapterUpdate):
            return await self._update_adapter(version, weights, checksum)
        got = state_checksum(weights)
        if got != checksum:
            raise WeightSyncError(f"weights version {version} failed its checksum ({got[:12]} != {checksum[:12]})")
        if checksum == self.checksum:  # the learner's weights did not move: nothing to load
            self.version = version
            return version

        async def load() -> str:
            await self.engine.engine.load_weights(weights)  # type: ignore[attr-defined]
            return checksum

        await self.swap(version, load, lambda _: self._equals_started_checkpoint(weights))
        return version

    def _equals_started_checkpoint(self, state: dict[str, Any]) -> bool:
        """Whether ``state`` equals the checkpoint the engine started from (or last loaded in
        place); names the checkpoint does not hold (e.g. a tied output layer) are not compared."""
        disk = checkpoint_tensors(self.engine.engine.model_path, state)  # type: ignore[attr-defined]
        return bool(disk) and all(torch.equal(t, state[n].to("cpu")) for n, t in disk.items())

    async def _update_adapter(self, version: int, update: AdapterUpdate, checksum: str) -> int:
        """Serve the policy's adapter at ``version`` (the engine checks the tensors against
        ``checksum`` before anything loads).  As with full weights, greedy generation must move
        unless the adapter equals the one served before."""
        if update.checksum != checksum:
            raise WeightSyncError(f"adapter version {version} announced with checksum {checksum[:12]}, "
                                  f"its payload says {update.checksum[:12]}")
        if checksum == self.checksum:
            self.version = version
            return version

        async def load() -> str:
            await self.engine.engine.load_adapter(replace(update, version=version))  # type: ignore[attr-defined]
            self.engine.adapter = update.name
            return checksum

        # the first adapter may leave the answer as it was: peft starts every B at zero
        await self.swap(version, load, same_as_initial=lambda _: True)
        logger.info("worker %d: policy version %d is adapter %r (%.1f MB)", self.worker_index, version, update.name,
                    update.nbytes / 2**20)
        return version

    async def swap(self, version: int, load: Callable[[], Awaitable[str]],
                   same_as_initial: Callable[[str], bool]) -> str:
        """The one weight swap of every update path (object store, adapter, collective, vLLM's
        transfer API): ``load`` runs with generation paused and drained and returns the checksum
        of what it loaded, and the greedy probe must then have moved.  Unchanged generation is
        right only when the weights equal those served before: the same checksum, or on the first
        update ``same_as_initial(checksum)`` (equal to the checkpoint the engine started from);
        anything else means the load did not take effect, and it raises.  Records the version,
        the checksum and :attr:`last_sync_s`; returns the checksum."""
        t0 = time.perf_counter()
        before = await self.probe_served()
        t1 = time.perf_counter()
        self.engine.pause()
        try:
            await self.engine.drained()
            checksum = await load()
        finally:
            self.engine.resume()
        t2 = time.perf_counter()
        after = await self._probe()
        self.last_sync_s = {"probe_s": t1 - t0 + time.perf_counter() - t2, "receive_load_s": t2 - t1}
        if after == before and checksum != self.checksum and not (self.checksum is None and same_as_initial(checksum)):
            raise WeightSyncError(f"weights version {version} loaded but generation did not change")
        self.landed(version, checksum, after)
        logger.info("worker %d now serves policy version %d (%s; probe %.2f s, load %.2f s)", self.worker_index,
                    version, self.cfg.rollout.weight_sync, self.last_sync_s["probe_s"],
                    self.last_sync_s["receive_load_s"])
        return checksum

    async def probe_served(self) -> list[float]:
        """The probe of the weights served now: the one taken when they landed, else a new one.

        Forgets it: until :meth:`landed` records the next one, an update in progress or one
        that failed leaves the served weights unknown."""
        cached, self._served_probe = self._served_probe, None
        if cached is not None and cached[0] == self.engine.adapter:
            return cached[1]
        return await self._probe()

    def landed(self, version: int, checksum: str, probe: list[float]) -> None:
        """Record an update that took effect: its version, checksum and the probe taken after it."""
        self.version, self.checksum = version, checksum
        self._served_probe = (self.engine.adapter, probe)

    async def _probe(self) -> list[float]:
        """Greedy logprobs of a fixed prompt: they move whenever the served weights move."""
        ids = self.engine.tokenizer(_PROBE, add_special_tokens=False).input_ids
        out = await self.engine.engine.generate(ids, Sampling(max_new_tokens=4, temperature=0.0,
                                                              adapter=self.engine.adapter))
        return [round(lp, 6) for lp in out.logprobs] + list(map(float, out.token_ids))

    def set_verification_budget(self, budget: int) -> None:
        """Critique-revise rounds per action for later episodes (0 turns the critic off).

        Builds the configured verifier the first time a budget > 0 needs one.  Call it between
        ``collect`` calls: episodes in flight would mix budgets.
        """
        if budget < 0:
            raise ValueError(f"verification budget {budget} must be >= 0")
        self.cfg = replace(self.cfg, critic=replace(self.cfg.critic, verification_budget=budget))
        if budget > 0 and self.runner.verifier is None:
            self.runner.verifier = self._guard(build_verifier(self.cfg, self.runner.data, self.connect_critic,
                                                              policy_engine=self.engine.engine))
        self.runner.cfg = self.cfg
        self.runner.budget = budget

    async def set_critic(self, critic: CriticConfig) -> str:
        """Serve later critiques from ``critic`` (the pipeline switches to its trained critic).

        Keeps the verification budget; the old verifier is closed (a model critic's actors end)
        and the new one is built when a budget > 0 needs it.  Returns the critic's description.
        """
        critic = replace(critic, verification_budget=self.cfg.critic.verification_budget)
        if critic != self.cfg.critic:
            old, self.runner.verifier = self.runner.verifier, None
            if old is not None:
                await old.close()
            self.cfg = replace(self.cfg, critic=critic)
            self.set_verification_budget(critic.verification_budget)
        return critic_description(critic)

    async def set_domain(self, cfg: CastConfig, data: DomainData) -> str:
        """Run later episodes in ``cfg.env``'s domain on ``data``, with the same engine.

        An evaluation of several domains (``eval.domains``) switches one worker from domain to
        domain instead of starting an engine per domain.  Only ``cfg.env`` is read: the policy,
        its sampling, the critic and the verification budget stay the worker's, as do its weights
        version, checksum and counters (:meth:`metrics` counts over every domain).  A rule critic
        checks tool arguments against the domain's tools, so its verifier is closed and built
        again for ``data`` (when the budget needs one); a model critic does not read the domain
        and is kept.  Call it between ``collect`` calls: episodes in flight would end in the old
        domain's runner.  Returns the domain's name.
        """
        self.cfg = replace(self.cfg, env=cfg.env)
        verifier = self.runner.verifier
        if self.cfg.critic.backend == "rule":
            self.runner.verifier = None
            if verifier is not None:
                await verifier.close()
            verifier = None
            if self.cfg.critic.verification_budget > 0:
                verifier = self._guard(build_verifier(self.cfg, data, self.connect_critic,
                                                      policy_engine=self.engine.engine))
        old = self.runner
        self.runner = EpisodeRunner(self.cfg, data, self.plays, verifier, policy_version=lambda: self.version,
                                    user_complete=old.user_complete)
        self.runner.budget = old.budget
        self.runner.stats = old.stats
        logger.info("worker %d now runs %s episodes (%s)", self.worker_index, data.domain, cfg.env.data_dir)
        return data.domain

    def _guard(self, verifier: Any) -> Any:
        if verifier is None or isinstance(verifier, GuardedVerifier):
            return verifier
        return GuardedVerifier(verifier, self.cfg.critic.on_unparsable, self.critic_counts)

    async def close(self) -> None:
        """Shut the engine down cleanly (its processes and shared memory) before the actor goes,
        and the critic actors this worker's verifier holds."""
        if self.runner.verifier is not None:
            await self.runner.verifier.close()
        await self.engine.engine.close()  # type: ignore[attr-defined]

    def pause(self) -> None:
        self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()

    def metrics(self) -> dict[str, float]:
        s = self.runner.stats
        episodes = max(s.episodes, 1)
        out = {
            "rollout/episodes": s.episodes,
            "rollout/policy_tokens": s.policy_tokens,
            "rollout/policy_tokens_per_s": s.policy_tokens / self._busy_s if self._busy_s else 0.0,
            "rollout/malformed_calls_per_episode": s.malformed_calls / episodes,
            "rollout/extra_calls_dropped": s.extra_calls_dropped,
            "rollout/critiques": s.critiques,
            "rollout/critic_unparsable": self.critic_counts["unparsable"],
            "rollout/token_inconsistent_rate": s.inconsistent_token_episodes / episodes,
            "rollout/policy_version": self.version,
        }
        for reason, n in s.terminations.items():
            out[f"rollout/termination/{reason}"] = n
        return out


EPISODES_KEY = "rollout/episodes"
"""The count :func:`merge_worker_metrics` weights per-episode rates by."""


def merge_worker_metrics(per_worker: list[dict[str, float]]) -> dict[str, float]:
    """One set of ``rollout/`` metrics from each worker's :meth:`RolloutWorker.metrics`.

    Counts and throughputs (``*_per_s``) add up: the workers generate at the same time, so the
    group's throughput is the sum of theirs.  Per-episode rates (``*_rate``, ``*_per_episode``)
    are weighted by each worker's ``rollout/episodes``.  ``rollout/policy_version`` is the newest
    version any worker serves.
    """
    episodes = sum(m.get(EPISODES_KEY, 0.0) for m in per_worker)
    merged: dict[str, float] = {}
    for m in per_worker:
        for key, value in m.items():
            if key.endswith(("_rate", "_per_episode")):
                share = m.get(EPISODES_KEY, 0.0) / episodes if episodes else 0.0
                merged[key] = merged.get(key, 0.0) + value * share
            elif key == "rollout/policy_version":
                merged[key] = max(merged.get(key, value), value)
            else:
                merged[key] = merged.get(key, 0.0) + value
    return merged
