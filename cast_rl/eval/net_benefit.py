"""The critic's net benefit at the actions it flags, pass^k per token per budget, and the budget.

A critic in the loop stops proposals it judges invalid and shows the policy a critique; the policy
revises.  Whether that helps depends on the critic being right *and* on what the policy does with
the critique, and it costs tokens.  Three measurements, all on real episodes (environment,
scripted user, the runner's own loop):

**Net benefit at flagged actions** (:func:`flagged_benefit`).  An episode runs with the critic at
budget B while the runner keeps a fork of the state at every decision point.  At each decision
whose first proposal the critic rejected (message ``m``), two branches are played from forks,
``k`` times each with the same seeds (:meth:`EpisodeRunner.continue_from` with ``action=``):
(a) *proposal*: from the state before ``m`` the rejected proposal runs in the policy's place;
(b) *revision*: from the state before the action that finally ran at this decision (after the
critique, and any further rounds), that action runs, as it did in the episode.  Both branches
then continue with the policy and no critic, so the comparison isolates this one decision's
critique from later ones.  Per seed, outcome 0 -> 1 (proposal fails, revision succeeds) is
*helped*, 1 -> 0 *harmed*, equal *unchanged*.  Each flag is grouped by the critic's error type, or
``false_positive`` when the privileged labeller (gold actions, the database) judges the proposal
valid where it ran in branch (a).

**pass^k per token for each budget** (:func:`budget_table`).  Every task runs n trials at each
budget; pass^k (k = 1..n, :mod:`cast_rl.eval.passk`) is divided by the mean tokens an episode
spent: the policy's generated tokens plus the critic's.  The critic's tokens are counted as
``critique_text``: the tokens (policy tokenizer) of every critique shown to the policy, which is
what a rule critic costs the loop; a model critic's own prompt and completion are not visible
through the :class:`~cast_rl.critique.verifier.Verifier` protocol and are not counted.

**The budget chosen** (:func:`choose_budget`): the B maximising pass^k per token for
``pipeline.benefit_passk`` (default k = 1: successes per token, the inverse of the tokens paid per
solved task; a larger k rewards consistency), ties to the smaller budget.

:class:`FalsePositiveVerifier` wraps any verifier and rejects, at a controlled rate p, proposals
the wrapped critic judges valid (deterministic from a seed and the request), to validate the
above: harm must rise with p and the chosen budget fall.  Harm needs a policy that acts on a wrong
critique; the noisy teacher with ``defers=True`` (:mod:`cast_rl.rollout.noisy_expert`) is one.

:func:`measure_benefit` is the one entry point (the ``cast-rl benefit`` command; a pipeline stage).
Pure Python and asyncio, like :mod:`cast_rl.critique.blame`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cast_rl.critique.blame import branch_seed
from cast_rl.critique.labeller import Labeller
from cast_rl.critique.rationale import Rationale, format_critique
from cast_rl.critique.verifier import Critique, VerifyRequest
from cast_rl.envs.core import DomainData
from cast_rl.envs.types import RESPOND, Action
from cast_rl.eval.passk import is_success, passk
from cast_rl.records import CRITIC_NAME, Trajectory
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy, episode_teacher
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec, EpisodeState, tree_points

CRITIC_TOKENS = "critique_text"
"""How critic tokens are counted: the tokens of each critique the policy was shown."""
FALSE_POSITIVE = "false_positive"


class FalsePositiveVerifier:
    """``inner``'s critiques, except that a proposal ``inner`` judges valid is rejected with
    probability ``rate``: decided by a hash of ``seed`` and the request (domain, visible messages,
    proposal), so a rerun flags the same proposals.  The injected critique names ``critic`` as
    ``<inner>+false_positive`` and says the call's arguments (or the message) are not supported,
    in the rule critic's format; ``counts`` has ``answers`` and ``injected``."""

    def __init__(self, inner: Any, rate: float, seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"false-positive rate {rate!r} is not allowed; it must be in [0, 1]")
        self.inner = inner
        self.rate = rate
        self.seed = seed
        self.counts = {"answers": 0, "injected": 0}

    async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
        critiques = await self.inner.verify(requests)
        out = []
        for request, critique in zip(requests, critiques):
            self.counts["answers"] += 1
            if critique.verdict == "valid" and self.rate > 0 and self.draw(request) < self.rate:
                self.counts["injected"] += 1
                critique = false_critique(request, critique.critic)
            out.append(critique)
        return out

    def draw(self, request: VerifyRequest) -> float:
        """A number in [0, 1) fixed by the seed and the request."""
        key = json.dumps([self.seed, request.domain, request.messages, request.proposal], sort_keys=True, default=str)
        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2.0**64

    async def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            await close()


def false_critique(request: VerifyRequest, critic: str = "") -> Critique:
    """An ``invalid`` critique of a valid proposal, worded as the rule critic words its own."""
    name = str(request.proposal.get("name", ""))
    if name == RESPOND:
        rationale = Rationale("invalid", "policy_violation", explanation="This message does not follow the policy.",
                              suggested_fix="Check the policy before replying.")
    else:
        rationale = Rationale(
            "invalid", "hallucination",
            explanation=f"An argument of the call to {name} is not supported by what the user said or the tools returned.",
            suggested_fix="Use only values the user gave or the tools returned.",
        )
    return Critique(rationale.verdict, rationale.error_type, rationale.to_json(), format_critique(rationale),
                    critic=f"{critic or 'critic'}+{FALSE_POSITIVE}")


@dataclass
class BenefitRecord:
    """One flagged decision: both branches, ``k`` seeds each, and what the critique changed."""

    budget: int
    split: str
    task_index: int
    trial: int
    message_index: int
    """The rejected proposal's message index (the decision point is just before it)."""
    error_type: str
    """The critic's error type on the flag."""
    critic: str
    proposal: dict[str, Any]
    revision: dict[str, Any]
    """The action that finally ran at this decision."""
    proposal_valid: bool | None
    """The privileged labeller's verdict on the proposal where it ran (branch a); None if unknown."""
    k: int = 0
    proposal_successes: int = 0
    revision_successes: int = 0
    helped: int = 0
    harmed: int = 0
    unchanged: int = 0

    @property
    def category(self) -> str:
        """``false_positive`` for a proposal the labeller judges valid, else the critic's error type."""
        return FALSE_POSITIVE if self.proposal_valid else self.error_type

    def count(self, proposal_outcomes: list[bool], revision_outcomes: list[bool]) -> None:
        """Set the counts from paired outcomes (same seed at the same position)."""
        if len(proposal_outcomes) != len(revision_outcomes):
            raise ValueError("the two branches need the same number of continuations")
        self.k = len(proposal_outcomes)
        self.proposal_successes, self.revision_successes = sum(proposal_outcomes), sum(revision_outcomes)
        self.helped = sum(1 for a, b in zip(proposal_outcomes, revision_outcomes) if not a and b)
        self.harmed = sum(1 for a, b in zip(proposal_outcomes, revision_outcomes) if a and not b)
        self.unchanged = self.k - self.helped - self.harmed

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "category": self.category}


async def flagged_benefit(
    runner: EpisodeRunner, spec: EpisodeSpec, k: int, seed: int = 0, labeller: Labeller | None = None,
) -> tuple[Trajectory, list[BenefitRecord]]:
    """Run ``spec`` with ``runner`` (its verifier and budget) and, at every decision whose first
    proposal the critic rejected, play both branches ``k`` times (see the module doc).  Returns
    the episode and one record per flagged decision; ``k=0`` only runs the episode."""
    snapshots: dict[int, EpisodeState] = {}

    def keep(state: EpisodeState) -> None:
        if state.message_index not in snapshots:
            snapshots[state.message_index] = state.fork()

    traj = await runner.run(spec, on_decision=keep if k > 0 else None)
    if k <= 0:
        return traj, []
    turns = traj.turns
    unchecked = EpisodeRunner(runner.cfg, runner.data, runner.engine, None, runner.policy_version,
                              runner.user_complete)
    records = []
    for m in tree_points(traj, "flagged", runner.data.spec.write_tools):
        flagged = next(t for t in turns if t.message_index == m)
        revised = next((t for t in turns if t.message_index > m and t.executed), None)
        if flagged.action is None or revised is None or revised.action is None:
            continue  # the decision ended the episode (context, timeout) or ran a malformed turn
        critique = next(r.critique for r in traj.verification_rounds if r.message_index == m)
        record = BenefitRecord(
            runner.budget, spec.split, spec.task_index, spec.trial, m, flagged.error_type or "unknown",
            critique.get("critic", ""), flagged.action, revised.action, None,
        )
        seeds = [branch_seed(seed, ("benefit", *spec.key, m), b) for b in range(k)]
        proposal = Action(flagged.action["name"], dict(flagged.action["kwargs"]))
        revision = Action(revised.action["name"], dict(revised.action["kwargs"]))
        branches = await asyncio.gather(
            *(unchecked.continue_from(snapshots[m], action=proposal, seed=s) for s in seeds),
            *(unchecked.continue_from(snapshots[revised.message_index], action=revision, seed=s) for s in seeds),
        )
        record.count([is_success(b.reward) for b in branches[:k]], [is_success(b.reward) for b in branches[k:]])
        if labeller is not None:
            label = next((lab for lab in labeller.label(branches[0]) if lab.message_index == m), None)
            record.proposal_valid = None if label is None else label.verdict == "valid"
        records.append(record)
    return traj, records


def critic_tokens(traj: Trajectory, tokenizer: Any) -> int:
    """Tokens of the critiques the policy was shown in ``traj`` (see :data:`CRITIC_TOKENS`)."""
    return sum(
        len(tokenizer(m["content"], add_special_tokens=False).input_ids)
        for m in traj.messages
        if m.get("role") == "user" and m.get("name") == CRITIC_NAME
    )


def budget_row(trajectories: list[Trajectory], tokenizer: Any) -> dict[str, Any]:
    """pass^k (k = 1..n), tokens per episode and pass^k per 1000 tokens of one budget's episodes."""
    rewards: dict[Any, list[float]] = {}
    for t in sorted(trajectories, key=lambda t: (t.split, t.task_index, t.trial)):
        rewards.setdefault((t.split, t.task_index), []).append(t.reward)
    policy = sum(t.policy_tokens for t in trajectories) / len(trajectories)
    critic = sum(critic_tokens(t, tokenizer) for t in trajectories) / len(trajectories)
    table = passk(rewards)
    tokens = policy + critic
    return {
        "episodes": len(trajectories),
        "passk": {str(k): v for k, v in table.items()},
        "policy_tokens_per_episode": policy,
        "critic_tokens_per_episode": critic,
        "critic_tokens": CRITIC_TOKENS,
        "tokens_per_episode": tokens,
        "passk_per_1k_tokens": {str(k): (1000.0 * v / tokens if tokens else 0.0) for k, v in table.items()},
    }


def choose_budget(table: dict[int, dict[str, Any]], k: int = 1) -> int:
    """The budget whose pass^k per 1000 tokens is largest (ties: the smaller budget)."""
    if not table:
        raise ValueError("choose_budget needs at least one budget")
    missing = [b for b, row in table.items() if str(k) not in row["passk_per_1k_tokens"]]
    if missing:
        raise ValueError(f"pass^{k} is not measured for budgets {missing}; k must be <= the trials per task")
    return max(sorted(table), key=lambda b: (table[b]["passk_per_1k_tokens"][str(k)], -b))


def benefit_metrics(records: list[BenefitRecord]) -> dict[str, float]:
    """``benefit/`` metrics of the flagged decisions: counts, rates and per-category counts."""
    pairs = sum(r.k for r in records)
    helped, harmed = sum(r.helped for r in records), sum(r.harmed for r in records)
    out = {
        "benefit/flags": float(len(records)),
        "benefit/false_positive_flags": float(sum(1 for r in records if r.proposal_valid)),
        "benefit/branch_pairs": float(pairs),
        "benefit/helped": float(helped),
        "benefit/harmed": float(harmed),
        "benefit/unchanged": float(pairs - helped - harmed),
        "benefit/help_rate": helped / pairs if pairs else 0.0,
        "benefit/harm_rate": harmed / pairs if pairs else 0.0,
        "benefit/net_rate": (helped - harmed) / pairs if pairs else 0.0,
    }
    for category in sorted({r.category for r in records}):
        group = [r for r in records if r.category == category]
        for name in ("helped", "harmed", "unchanged"):
            out[f"benefit/type/{category}/{name}"] = float(sum(getattr(r, name) for r in group))
        out[f"benefit/type/{category}/flags"] = float(len(group))
    return out


@dataclass
class BenefitReport:
    """What :func:`measure_benefit` measured and wrote."""

    fp_rate: float
    passk_k: int
    budgets: dict[int, dict[str, Any]]
    chosen_budget: int
    records: list[BenefitRecord]
    metrics: dict[str, float]
    critic_tokens: str = CRITIC_TOKENS
    files: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "fp_rate": self.fp_rate, "passk_k": self.passk_k, "critic_tokens": self.critic_tokens,
            "chosen_budget": self.chosen_budget, "budgets": {str(b): row for b, row in self.budgets.items()},
            "metrics": self.metrics,
        }


async def measure_benefit(
    cfg: Any,
    data: DomainData,
    tasks: list[int],
    engine_for: Callable[[EpisodeSpec], Any],
    verifier: Any,
    tokenizer: Any,
    out_dir: str | Path | None = None,
    split: str | None = None,
    user_complete: Any = None,
) -> BenefitReport:
    """The budget sweep with net benefit at every flag, and the chosen budget.

    Each of ``tasks`` (indices of ``split``, default ``cfg.env.split``) runs
    ``cfg.pipeline.benefit_trials`` trials at each budget of ``cfg.pipeline.benefit_budgets``,
    the policy from ``engine_for(spec)`` (one engine per episode, or one shared), ``verifier``
    wrapped by :class:`FalsePositiveVerifier` when ``cfg.pipeline.benefit_fp_rate`` > 0; flags
    get ``cfg.pipeline.benefit_k`` continuations per branch.  ``tokenizer`` (the policy's) counts
    critique tokens.  With ``out_dir`` it writes ``benefit.jsonl`` (one record per flag) and
    ``budgets.json`` (:meth:`BenefitReport.summary`).
    """
    pipe = cfg.pipeline
    split = split or cfg.env.split
    if pipe.benefit_fp_rate > 0:
        verifier = FalsePositiveVerifier(verifier, pipe.benefit_fp_rate, seed=cfg.seed)
    labeller = Labeller(data)
    specs = [EpisodeSpec(split, i, t) for i in tasks for t in range(pipe.benefit_trials)]
    table: dict[int, dict[str, Any]] = {}
    records: list[BenefitRecord] = []
    for budget in pipe.benefit_budgets:
        budget_cfg = replace(cfg, critic=replace(cfg.critic, verification_budget=budget))

        async def one(spec: EpisodeSpec, budget_cfg: Any = budget_cfg, budget: int = budget):  # noqa: ANN202
            runner = EpisodeRunner(budget_cfg, data, engine_for(spec), verifier if budget else None,
                                   user_complete=user_complete)
            return await flagged_benefit(runner, spec, pipe.benefit_k if budget else 0, cfg.seed, labeller)

        results = await asyncio.gather(*(one(s) for s in specs))
        table[budget] = budget_row([traj for traj, _ in results], tokenizer)
        records += [r for _, recs in results for r in recs]
    metrics = benefit_metrics(records)
    chosen = choose_budget(table, pipe.benefit_passk)
    for budget, row in table.items():
        for k, value in row["passk"].items():
            metrics[f"benefit/B{budget}/pass^{k}"] = value
            metrics[f"benefit/B{budget}/pass^{k}_per_1k_tokens"] = row["passk_per_1k_tokens"][k]
        metrics[f"benefit/B{budget}/tokens_per_episode"] = row["tokens_per_episode"]
        metrics[f"benefit/B{budget}/critic_tokens_per_episode"] = row["critic_tokens_per_episode"]
    metrics["benefit/chosen_budget"] = float(chosen)
    metrics["benefit/fp_rate"] = float(pipe.benefit_fp_rate)
    report = BenefitReport(pipe.benefit_fp_rate, pipe.benefit_passk, table, chosen, records, metrics)
    if out_dir is not None:
        write_benefit(report, out_dir)
    return report


def write_benefit(report: BenefitReport, out_dir: str | Path) -> None:
    """``benefit.jsonl`` (one record per flag) and ``budgets.json`` (:meth:`BenefitReport.summary`)
    in ``out_dir``; their paths go to ``report.files``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benefit.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in report.records))
    (out / "budgets.json").write_text(json.dumps(report.summary(), indent=2) + "\n")
    report.files = {"records": str(out / "benefit.jsonl"), "budgets": str(out / "budgets.json")}


def noisy_expert_policy(cfg: Any, data: DomainData, tokenizer: Any) -> Callable[[EpisodeSpec], Any]:
    """``engine_for`` of ``pipeline.benefit_policy=noisy_expert``: the deferential noisy teacher
    (:mod:`cast_rl.rollout.noisy_expert`), one engine per episode, its error (at
    ``pipeline.benefit_error_rate``, of ``pipeline.benefit_errors``) drawn from the episode's seed."""
    if data.spec.name != "retail":
        raise ValueError(f"pipeline.benefit_policy=noisy_expert is not allowed with env.domain={data.spec.name!r}; "
                         "the noisy teacher plays retail tasks only")
    kinds = tuple(cfg.pipeline.benefit_errors)

    def engine_for(spec: EpisodeSpec) -> NoisyExpertPolicy:
        return episode_teacher(tokenizer, data, spec.key, cfg.seed, cfg.pipeline.benefit_error_rate, kinds,
                               defers=True)

    return engine_for
