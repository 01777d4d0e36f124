"""Ray actor shell of :class:`cast_rl.rollout.worker.RolloutWorker` (engine + environment pool).

Each method is one line of intent that calls into the library.  The actor is async, so the
episodes of a ``collect`` call and the vLLM engine's output loop share one event loop.
"""

from __future__ import annotations

from typing import Any

import ray

from actors.critic_service import critic_client
from cast_rl.config.schema import CastConfig, CriticConfig
from cast_rl.critique.blame import BlameRecord
from cast_rl.envs.setup import load_env_data
from cast_rl.envs.users import user_engine
from cast_rl.eval.net_benefit import BenefitReport, measure_benefit
from cast_rl.inference import build_engine
from cast_rl.records import EpisodeSummary, Trajectory
from cast_rl.rollout import weights
from cast_rl.rollout.collector import Tree, Unit
from cast_rl.rollout.teacher import build_teacher_policy
from cast_rl.rollout.verifiers import build_verifier
from cast_rl.rollout.worker import RolloutWorker


@ray.remote
class RolloutWorkerActor:
    def __init__(self, cfg: CastConfig, worker_index: int, kind: str = "rollout") -> None:
        data = load_env_data(cfg)
        self.kind = kind
        if kind == "teacher":  # the teacher model plays; the policy's tokenizer writes the ids; no critic
            engine, verifier = build_teacher_policy(cfg, seed=cfg.seed + worker_index), None
        else:
            engine = build_engine(cfg.policy.path, cfg.inference, seed=cfg.seed + worker_index, dtype=cfg.policy.dtype,
                                  weight_transfer=cfg.rollout.weight_sync == "vllm_api")
            verifier = build_verifier(cfg, data, connect=critic_client, policy_engine=engine)
        self.worker = RolloutWorker(cfg, data, engine, verifier, worker_index=worker_index, connect_critic=critic_client)
        # user.type=llm on user.inference.backend=vllm: the user model's own engine, in this actor
        self.user_engine, self.worker.runner.user_complete = user_engine(cfg.user, seed=cfg.seed + worker_index)

    def ready(self) -> bool:
        return True

    async def collect(self, units: list[Unit], tree: Tree | None = None) -> list[Trajectory]:
        return await self.worker.collect(units, tree)

    @ray.method(num_returns=2)
    async def collect_summarized(self, units: list[Unit],
                                 tree: Tree | None = None) -> tuple[list[Trajectory], list[EpisodeSummary]]:
        """``collect``, as two results: the trajectories (their reference goes on to the replay
        buffer; the driver never reads it) and their summaries (what the driver reads)."""
        trajectories = await self.worker.collect(units, tree)
        return trajectories, [t.summary() for t in trajectories]

    async def blame(self, trajectories: dict[int, Trajectory], labels: list[dict[str, Any]], k: int,
                    seed: int) -> list[BlameRecord]:
        return await self.worker.blame(trajectories, labels, k, seed)

    async def benefit(self, cfg: CastConfig, tasks: list[int], split: str) -> BenefitReport:
        """The critic's net benefit with this worker's policy engine and critic (set a budget > 0 first)."""
        w = self.worker
        return await measure_benefit(cfg, w.runner.data, tasks, lambda _spec: w.engine, w.runner.verifier,
                                     w.engine.tokenizer, split=split, user_complete=w.runner.user_complete)

    async def update_weights(self, version: int, weights: Any, checksum: str) -> int:
        return await self.worker.update_weights(version, weights, checksum)

    def can_load_policy(self, path: str) -> bool:
        return self.worker.can_load_policy(path)

    async def load_policy(self, path: str) -> str:
        return await self.worker.load_policy(path)

    async def join_weight_sync(self, addr: str, port: int, rank_offset: int, world_size: int, backend: str,
                               timeout_s: float, key: str) -> list[int]:
        return await weights.join(self.worker, addr, port, rank_offset, world_size, backend, timeout_s, key)

    def weight_sync_key(self) -> str:
        return weights.joined(self.worker)

    async def receive_weights(self, version: int, meta: Any) -> tuple[int, str]:
        return await weights.receive(self.worker, version, meta)

    def last_sync_s(self) -> dict[str, float]:
        """Seconds the last update spent in the generation probe and in receiving and loading
        (empty before one)."""
        return dict(self.worker.last_sync_s)

    async def greedy_answer(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        return await weights.greedy_answer(self.worker, prompt_ids, max_new_tokens)

    def set_verification_budget(self, budget: int) -> int:
        self.worker.set_verification_budget(budget)
        return budget

    async def set_critic(self, critic: CriticConfig) -> str:
        return await self.worker.set_critic(critic)

    async def set_domain(self, cfg: CastConfig) -> str:
        """Later episodes in ``cfg.env``'s domain, on this worker's engine (a policy worker only)."""
        if self.kind != "rollout":
            raise ValueError(f"set_domain switches a policy rollout worker's domain; this is a {self.kind!r} worker "
                             "(the teacher's workers collect the training domain only)")
        return await self.worker.set_domain(cfg, load_env_data(cfg))

    def pause(self) -> None:
        self.worker.pause()

    def resume(self) -> None:
        self.worker.resume()

    def version(self) -> int:
        return self.worker.version

    def metrics(self) -> dict[str, float]:
        return self.worker.metrics()

    async def close(self) -> None:
        await self.worker.close()
        if self.user_engine is not None:
            await self.user_engine.close()
