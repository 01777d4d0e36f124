"""The LLM verification framework: labels from six LLM roles instead of hand-written rules.

``labeller.backend=llm`` labels every action of a trajectory with the roles of
:mod:`cast_rl.critique.llm_roles`, each answer decoded under its JSON schema (structured outputs):

1. per trajectory, the *rule extractor* picks the policy lines that bear on the request and the
   *tool extractor* describes the tools the trajectory calls;
2. per action, the *hallucination*, *domain-violation* and *tool-call* checkers judge it from
   the visible conversation **and privileged information**: the task's gold actions, the outcome,
   the difference between the final state and the gold final state, and what the call did when
   replayed (its result, whether it changed the database the way a gold action does);
3. per action, the *final verdict* combines the checkers' findings into the label (valid or an
   error type) and writes the rationale the critic is trained on.  It is not shown the
   privileged section, and its rationale goes through the same leakage check as the rules'
   (:func:`cast_rl.critique.rationale.leakage_problems`); one that fails is dropped (the label
   stands, ``rationale`` is None) and counted.

``labeller.backend=hybrid`` runs the rule labeller (:class:`~cast_rl.critique.labeller.Labeller`)
first: where a rule fires, its verdict stands and the final verdict only explains it (its label
choice narrowed to the rule's); where none fires, the checkers and the final verdict decide.  A
leaking rationale falls back to the rules' one when both agree on the label.

Labels are today's format (:class:`~cast_rl.critique.labeller.ActionLabel`, ``source``
``llm:<checker>`` or ``llm:valid``), with ``ran``, ``changed_state`` and the decisive action of
a failed trajectory as the rule labeller sets them.  All calls of a stage are issued at once
(``labeller.max_concurrency`` in flight) so the engine batches them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from cast_rl.config.schema import LabellerConfig
from cast_rl.critique import llm_roles as roles
from cast_rl.critique.context import MALFORMED, RESPOND, ActionRef, Visible
from cast_rl.critique.labeller import (
    ActionLabel,
    Labeller,
    LabelStats,
    actions_ran,
    changes,
    decisive_label,
    same_effect,
)
from cast_rl.critique.prompt import render_message, render_proposal
from cast_rl.critique.rationale import Evidence, Rationale, leakage_problems
from cast_rl.envs.core import DomainData, ToolEnv, call_tool
from cast_rl.envs.types import Action, is_success
from cast_rl.inference import build_engine
from cast_rl.inference.base import Sampling
from cast_rl.models.setup import ensure_model
from cast_rl.records import Trajectory

logger = logging.getLogger(__name__)

MAX_RULES = 4
"""Policy lines the rule extractor picks per trajectory."""
PRIVILEGED_HEADER = "# Reference (privileged: for judging only; the agent never saw it)"


@dataclass
class VerifierStats:
    """What the LLM verifier did: calls, parse failures, tokens and leaks, per role."""

    calls: Counter[str] = field(default_factory=Counter)
    parse_failures: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rationales: int = 0
    """Rationales the final verdict wrote that were checked for leakage."""
    leaks: int = 0
    """Of those, the ones that failed the leakage check."""
    rule_decided: int = 0
    """Hybrid: actions whose verdict a rule decided."""
    fallbacks: int = 0
    """Hybrid: leaking rationales replaced by the rules' one."""

    def metrics(self) -> dict[str, float]:
        calls = sum(self.calls.values())
        failures = sum(self.parse_failures.values())
        return {
            "label/verifier_calls": calls,
            "label/verifier_parse_failures": failures,
            "label/verifier_parse_rate": 1.0 - failures / calls if calls else 1.0,
            "label/verifier_prompt_tokens": self.prompt_tokens,
            "label/verifier_completion_tokens": self.completion_tokens,
            "label/verifier_leaks": self.leaks,
            "label/verifier_leakage_rate": self.leaks / self.rationales if self.rationales else 0.0,
            "label/verifier_rule_decided": self.rule_decided,
            "label/verifier_fallbacks": self.fallbacks,
        }


@dataclass
class _Item:
    """One action being verified."""

    action: ActionRef
    visible: Visible
    ran: bool
    changed: bool
    facts: str
    """Privileged facts of the action (its replayed result)."""
    rule_label: ActionLabel | None = None
    answers: dict[str, Any] = field(default_factory=dict)

    @property
    def rule_decides(self) -> bool:
        return self.rule_label is not None and self.rule_label.verdict == "invalid"


@dataclass
class _Case:
    """One trajectory being verified."""

    index: int
    trajectory: Trajectory
    reference: str
    """The privileged section: gold actions, outcome, final-state difference."""
    items: list[_Item]
    rules: list[str] = field(default_factory=list)
    tools: roles.ToolsAnswer | None = None


class LLMVerifier:
    """Labels trajectories of one domain with an LLM behind an engine (module docstring)."""

    def __init__(self, engine: Any, data: DomainData, backend: str = "llm", max_prompt_chars: int = 6000,
                 max_concurrency: int = 32, max_new_tokens: int = 384, temperature: float = 0.0,
                 top_p: float = 1.0) -> None:
        if backend not in ("llm", "hybrid"):
            raise ValueError(f"labeller.backend={backend!r}: the LLM verifier serves llm and hybrid")
        self.engine, self.data, self.backend = engine, data, backend
        self.rule_labeller = Labeller(data) if backend == "hybrid" else None
        self.max_prompt_chars = max_prompt_chars
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self._gate = asyncio.Semaphore(max_concurrency)
        self.stats = LabelStats()
        self.counts = VerifierStats()
        self._policy_lines = policy_lines(data.policy)

    async def label(self, trajectories: list[Trajectory], start: int = 0) -> list[ActionLabel]:
        """Labels of every action, ``trajectory_index`` counted from ``start``."""
        cases = [self._case(i, t) for i, t in enumerate(trajectories, start)]
        await _all([self._extract_rules(c) for c in cases] + [self._extract_tools(c) for c in cases])
        logger.info("verifier: extracted rules and tools of %d trajectories", len(cases))
        await _all([self._check(c, it, role) for c in cases for it in c.items if not it.rule_decides
                    for role in _checkers(it.action)])
        logger.info("verifier: checked %d actions", sum(len(c.items) for c in cases))
        await _all([self._verdict(c, it) for c in cases for it in c.items])
        labels = []
        for case in cases:
            own = [self._finish(case, it) for it in case.items]
            self.stats.trajectories += 1
            if not is_success(case.trajectory.reward):
                decisive = decisive_label(own)
                if decisive is not None:
                    decisive.decisive = True
                self.stats.add_outcome(case.trajectory, case.index, decisive)
            labels += own
        return labels

    def metrics(self) -> dict[str, float]:
        return {**self.stats.metrics(), **self.counts.metrics()}

    # ------------------------------------------------------------ preparing a trajectory

    def _case(self, index: int, trajectory: Trajectory) -> _Case:
        env = ToolEnv(self.data, trajectory.split, trajectory.task_index, max_steps=None)
        gold = list(env.task.actions)
        gold_keys = {_key(a.name, a.kwargs) for a in gold}
        rule_labels = self.rule_labeller.label(trajectory, index) if self.rule_labeller else None
        items = []
        for pos, (action, ran) in enumerate(actions_ran(trajectory)):
            visible = Visible(self.data.policy, trajectory.messages[: action.message_index], self.data.tools)
            facts, changed = "", False
            if not action.is_reply and action.name != MALFORMED:
                db = env.db if ran else env.db.fork()
                before = db.fork()
                result = call_tool(self.data, db, Action(action.name, action.kwargs))
                effect = changes(before, db)
                changed = bool(effect)
                facts = _facts(self.data, before, result, effect, action, gold, gold_keys, ran)
            elif action.name == MALFORMED:
                ran, facts = True, "The call could not be parsed (no tool ran)."
            items.append(_Item(action, visible, ran, changed, facts, rule_labels[pos] if rule_labels else None))
        gold_db = self.data.gold_db(trajectory.split, trajectory.task_index)
        return _Case(index, trajectory, _reference(gold, trajectory.reward, state_difference(
            changes(self.data.for_split(trajectory.split).db, env.db),
            changes(self.data.for_split(trajectory.split).db, gold_db))), items)

    # ------------------------------------------------------------ the roles

    async def _ask(self, role: str, system: str, user: str, schema: dict[str, Any]) -> Any:
        sampling = Sampling(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                            logprobs=False, json_schema=schema)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        async with self._gate:
            self.counts.calls[role] += 1
            try:
                completion = await self.engine.chat(messages, sampling)
            except Exception as exc:  # a failed call is a missing answer, counted with the failures
                logger.warning("verifier %s call failed: %s", role, exc)
                self.counts.parse_failures[role] += 1
                return None
        self.counts.prompt_tokens += completion.prompt_tokens
        self.counts.completion_tokens += len(completion.token_ids)
        answer = roles.decode(role, completion.text)
        if answer is None:
            self.counts.parse_failures[role] += 1
            logger.debug("verifier %s answer did not parse (%s): %r", role, completion.finish_reason,
                         completion.text[:200])
        return answer

    async def _extract_rules(self, case: _Case) -> None:
        first = next((text for _, text in case.items[0].visible.user_texts), "") if case.items else ""
        first = first or next((m.get("content") or "" for m in case.trajectory.messages
                               if m.get("role") == "user"), "")
        user = f"# Policy\n{self.data.policy}\n\n# Customer's first message\n{first[:1000]}"
        answer = await self._ask("rule_extractor", roles.RULE_EXTRACTOR.format(domain=self.data.domain, n=MAX_RULES),
                                 user, roles.rule_schema(self._policy_lines, MAX_RULES))
        case.rules = list(dict.fromkeys(answer.rules)) if answer else []

    async def _extract_tools(self, case: _Case) -> None:
        used = sorted({it.action.name for it in case.items if not it.action.is_reply} - {MALFORMED})
        specs = [t for t in self.data.tools if t.get("function", {}).get("name") in used]
        if not specs:
            return
        user = "# Tools\n" + "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in specs)
        names = [t["function"]["name"] for t in specs]
        case.tools = await self._ask("tool_extractor", roles.TOOL_EXTRACTOR.format(domain=self.data.domain),
                                     user, roles.tool_schema(names))

    async def _check(self, case: _Case, item: _Item, role: str) -> None:
        domain = self.data.domain
        head = f"{PRIVILEGED_HEADER}\n{case.reference}\n\n"
        if role == "domain_violation":
            head += "# Policy rules\n" + "\n".join(f"- {r}" for r in case.rules or ["(none extracted)"]) + "\n\n"
        if role == "tool_call" and case.tools is not None:
            head += "# Tools\n" + "\n".join(f"- {t.name}: {t.kind}; requires {t.requires}"
                                             for t in case.tools.tools) + "\n\n"
        user = head + self._conversation(item)
        if item.facts:
            user += f"\n\n# What the call did (privileged)\n{item.facts}"
        system, schema = {
            "hallucination": (roles.HALLUCINATION, roles.HALLUCINATION_SCHEMA),
            "domain_violation": (roles.DOMAIN_VIOLATION, roles.violation_schema(case.rules)),
            "tool_call": (roles.TOOL_CALL, roles.TOOL_CALL_SCHEMA),
        }[role]
        item.answers[role] = await self._ask(role, system.format(domain=domain), user, schema)

    async def _verdict(self, case: _Case, item: _Item) -> None:
        if item.rule_decides:
            assert item.rule_label is not None
            labels: tuple[str, ...] = (item.rule_label.error_type,)
            findings = f"A rule found: {item.rule_label.error_type}."
        else:
            labels = roles.LABELS
            findings = "\n".join(_finding(role, item.answers.get(role)) for role in _checkers(item.action))
        rules = "# Policy rules\n" + "\n".join(f"- {r}" for r in case.rules or ["(none extracted)"])
        user = f"{rules}\n\n{self._conversation(item)}\n\n# Checkers' findings\n{findings}"
        schema = roles.verdict_schema(labels, case.rules, item.action.message_index - 1)
        item.answers["final_verdict"] = await self._ask(
            "final_verdict", roles.FINAL_VERDICT.format(domain=self.data.domain), user, schema)

    def _conversation(self, item: _Item) -> str:
        """The visible transcript (newest kept within ``max_prompt_chars``) and the action."""
        lines = [render_message(i, m, max_chars=600) for i, m in enumerate(item.visible.messages)
                 if m.get("role") != "system"]
        budget, kept = self.max_prompt_chars, []
        for line in reversed(lines):
            if budget - len(line) < 0 and kept:
                break
            kept.append(line)
            budget -= len(line) + 1
        head = "(earlier messages omitted)\n" if len(kept) < len(lines) else ""
        return (f"# Conversation\n{head}" + "\n".join(reversed(kept))
                + f"\n\n# Action (message {item.action.message_index})\n{render_proposal(item.action.to_json())}")

    # ------------------------------------------------------------ the label

    def _finish(self, case: _Case, item: _Item) -> ActionLabel:
        verdict: roles.VerdictAnswer | None = item.answers.get("final_verdict")
        rule = item.rule_label
        if item.rule_decides:
            assert rule is not None
            self.counts.rule_decided += 1
            label, source = rule.error_type, rule.source
        elif verdict is not None:
            label = verdict.label
            source = f"llm:{label}" if label == "valid" else f"llm:{_checker_of(label)}"
        else:  # no readable verdict: the first checker that found an error decides
            label = next((roles.CHECKER_TYPES[r] for r in roles.CHECKERS
                          if getattr(item.answers.get(r), "error", False)), "valid")
            source = "llm:checkers"
        error_type = "none" if label == "valid" else label
        rationale: dict[str, Any] | None = None
        leaked = False
        if verdict is not None and verdict.label == label:
            written = Rationale(
                verdict="valid" if label == "valid" else "invalid", error_type=error_type,
                evidence=[Evidence(i, q) for i, q in verdict.evidence if q.strip()],
                policy_clause=verdict.clause, explanation=verdict.explanation, suggested_fix=verdict.fix)
            self.counts.rationales += 1
            problems = leakage_problems(written, item.visible, item.action)
            if problems:
                leaked = True
                self.counts.leaks += 1
                logger.debug("verifier rationale at message %d leaks: %s", item.action.message_index, problems)
            else:
                rationale = written.to_json()
        if rationale is None and rule is not None and rule.error_type == error_type and rule.rationale:
            rationale = rule.rationale  # hybrid: the rules' own explanation
            self.counts.fallbacks += leaked
        out = ActionLabel(
            trajectory_index=case.index, message_index=item.action.message_index,
            call_index=item.action.call_index, action=item.action.to_json(),
            verdict="valid" if label == "valid" else "invalid", error_type=error_type,
            rationale=rationale, source=source, ran=item.ran, changed_state=item.changed)
        self.stats.add(out, rationale is None and leaked)
        return out


def _checkers(action: ActionRef) -> tuple[str, ...]:
    """The checkers an action gets: a reply has no tool call to check."""
    return roles.CHECKERS[:2] if action.name == RESPOND else roles.CHECKERS


def _checker_of(error_type: str) -> str:
    return next(r for r, t in roles.CHECKER_TYPES.items() if t == error_type)


def _finding(role: str, answer: Any) -> str:
    if answer is None:
        return f"{role}: no answer"
    if role == "hallucination":
        values = ", ".join(answer.ungrounded) or "none"
        return f"hallucination: {'yes' if answer.hallucination else 'no'} (values not visible: {values})"
    if role == "domain_violation":
        return f"policy_violation: {'yes' if answer.violation else 'no'} (rule: {answer.rule})"
    return f"wrong_tool_usage: {'yes' if answer.wrong_tool_usage else 'no'} ({answer.problem or 'no problem'})"


def policy_lines(policy: str, max_chars: int = 200) -> list[str]:
    """The policy's lines a rule can be (verbatim substrings of the policy, so a cited clause
    passes the leakage check): non-empty, not a heading, at most ``max_chars`` long."""
    out = []
    for line in policy.splitlines():
        text = line.strip().lstrip("-*").strip()
        if len(text) >= 20 and not text.startswith("#"):
            out.append(text[:max_chars].strip())
    return list(dict.fromkeys(out)) or ["(the policy has no rule lines)"]


def _reference(gold: list[Action], reward: float, difference: str) -> str:
    steps = "\n".join(f"{i}. {render_proposal({'name': a.name, 'kwargs': a.kwargs})}"
                      for i, a in enumerate(gold, 1)) or "(none)"
    outcome = "succeeded" if is_success(reward) else "failed"
    return (f"Gold actions:\n{steps}\nOutcome: the conversation {outcome} (reward {reward:g})\n"
            f"Final state against the gold final state: {difference}")


def state_difference(final: dict[tuple[str, str], Any], gold: dict[tuple[str, str], Any], limit: int = 6) -> str:
    """Which records the final state and the gold final state disagree on (both given as their
    changes against the pristine database)."""
    keys = sorted({k for k in final.keys() | gold.keys()
                   if k not in final or k not in gold or not same_effect({k: final[k]}, {k: gold[k]})})
    if not keys:
        return "the same"
    parts = []
    for table, key in keys[:limit]:
        if (table, key) in final and (table, key) in gold:
            what = "changed differently from the gold"
        elif (table, key) in final:
            what = "changed, but the gold leaves it unchanged"
        else:
            what = "unchanged, but the gold changes it"
        parts.append(f"{table} {key}: {what}")
    more = f"; and {len(keys) - limit} more" if len(keys) > limit else ""
    return "differs: " + "; ".join(parts) + more


def _facts(data: DomainData, before: Any, result: str, effect: dict[tuple[str, str], Any], action: ActionRef,
           gold: list[Action], gold_keys: set[str], ran: bool) -> str:
    matches = "no change"
    if effect:
        matches = "no"
        for write in (a for a in gold if a.name == action.name):
            trial = before.fork()
            call_tool(data, trial, write)
            if same_effect(effect, changes(before, trial)):
                matches = "yes"
                break
    equal = "yes" if _key(action.name, action.kwargs) in gold_keys else "no"
    return (f"Result: {' '.join(result.split())[:300]}\nEqual to a gold action: {equal}\n"
            f"Ran: {'yes' if ran else 'no (a critic rejected it; judged on a copy)'}\n"
            f"Changed the database: {'yes' if effect else 'no'}; the change is one a gold action makes: {matches}")


def _key(name: str, kwargs: Any) -> str:
    return json.dumps([name, kwargs], sort_keys=True, default=str)


async def _all(calls: list[Awaitable[None]]) -> None:
    await asyncio.gather(*calls)


def build_verifier_engine(cfg: LabellerConfig, seed: int = 0) -> Any:
    """The engine of ``labeller.inference.backend`` serving ``labeller.model.path`` (for vllm, a
    tiny model is built there first when it is missing and ``make_tiny_if_missing`` allows it),
    served in ``labeller.model.dtype``."""
    path = str(ensure_model(cfg.model)) if cfg.inference.backend == "vllm" else cfg.model.path
    return build_engine(path, cfg.inference, seed=seed, dtype=cfg.model.dtype)


async def label_trajectories(
    cfg: LabellerConfig, data: DomainData, trajectories: list[Trajectory], engine: Any = None, seed: int = 0
) -> tuple[list[ActionLabel], LabelStats, dict[str, float]]:
    """Labels of ``labeller.backend`` llm or hybrid, the label statistics and the ``label/``
    metrics (the verifier's calls, parse rate, tokens and leaks among them).  Builds the engine
    (and closes it) unless ``engine`` is given."""
    own = engine is None
    engine = build_verifier_engine(cfg, seed) if own else engine
    verifier = LLMVerifier(engine, data, cfg.backend, cfg.max_prompt_chars, cfg.max_concurrency,
                           cfg.inference.max_new_tokens, cfg.inference.temperature, cfg.inference.top_p)
    try:
        labels = await verifier.label(trajectories)
    finally:
        if own:
            await engine.close()
    return labels, verifier.stats, verifier.metrics()
