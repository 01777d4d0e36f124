"""Critic datasets: labelled actions as supervised (prompt -> critique) examples in Parquet.

Run::

    cast-rl critic build-data --labels L.jsonl --trajectories T.jsonl --out DIR

Each labelled action becomes one example: the critic's chat prompt (the visible conversation up
to the action and the candidate action, :func:`cast_rl.critique.prompt.critic_messages`) and the
critique text in the fixed format that begins ``VERDICT: ...\\nERROR: ...``.  Examples are split
by trajectory into ``train`` and ``heldout`` (no trajectory in both), and each split is balanced
between valid and invalid by dropping examples of the larger class at random (seeded).  Labels
whose rationale failed the leakage check have no critique text and are skipped (counted).

Files: ``DIR/train.parquet`` and ``DIR/heldout.parquet`` with columns ``prompt_messages`` (JSON
string of OpenAI messages, what the learner's supervised mode reads), ``completion`` (text),
``verdict``, ``error_type``, ``domain``, ``trajectory_index``, ``message_index`` and ``request``
(JSON of the :class:`~cast_rl.critique.verifier.VerifyRequest`, to evaluate any verifier).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cast_rl.critique.context import iter_actions
from cast_rl.critique.prompt import MAX_PROMPT_CHARS, aliased, critic_messages, served_prompt
from cast_rl.critique.rationale import Rationale, format_critique
from cast_rl.critique.twins import twin_labels
from cast_rl.critique.verifier import VerifyRequest
from cast_rl.envs.core import DomainData
from cast_rl.jsonl import iter_jsonl
from cast_rl.models.aliases import EntityAliases
from cast_rl.records import Trajectory, read_trajectories

logger = logging.getLogger(__name__)

LABEL_KEYS = ("trajectory_index", "message_index", "action", "verdict", "error_type", "rationale")


class LabelFormatError(ValueError):
    """A labels line that does not follow the format; names the file and line."""


def read_labels(path: str | Path) -> list[dict[str, Any]]:
    """The labels of a JSON Lines file; a malformed line raises :class:`LabelFormatError`."""
    return [obj for _, obj in iter_jsonl(path, _check_label, what="a label", error=LabelFormatError)]


def _check_label(obj: Any) -> dict[str, Any]:
    """``obj`` when it is a label; a ``ValueError`` saying what is wrong otherwise."""
    if not isinstance(obj, dict):
        raise ValueError("a label line must be a JSON object")
    missing = [k for k in LABEL_KEYS if k not in obj]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    for key in ("trajectory_index", "message_index"):
        if not isinstance(obj[key], int) or isinstance(obj[key], bool):
            raise ValueError(f"{key} must be an integer")
    if not isinstance(obj["action"], dict) or "name" not in obj["action"]:
        raise ValueError('action must be an object with "name" and "kwargs"')
    if obj["verdict"] not in ("valid", "invalid"):
        raise ValueError(f"verdict must be valid or invalid, got {obj['verdict']!r}")
    if obj["rationale"] is not None and not isinstance(obj["rationale"], dict):
        raise ValueError("rationale must be an object or null")
    return obj


@dataclass
class Example:
    request: VerifyRequest
    completion: str
    verdict: str
    error_type: str
    trajectory_index: int
    message_index: int

    def row(self, aliases: EntityAliases | None = None, max_prompt_chars: int = MAX_PROMPT_CHARS,
            system_prompt: bool = True) -> dict[str, Any]:
        """The Parquet row; with ``aliases`` the prompt and the completion read the conversation's
        identifiers as aliases, as the served critic will (``request`` keeps them real); the
        transcript is cut to ``max_prompt_chars`` (``critic.max_prompt_chars``) and the system
        message kept or left out (``critic.system_prompt``) as the served critic's are
        (:func:`~cast_rl.critique.prompt.critic_messages`)."""
        view, table = aliased(self.request, aliases)
        completion = self.completion if aliases is None or table is None else aliases.to_policy(table, self.completion)
        return {
            "prompt_messages": json.dumps(critic_messages(view, max_prompt_chars, system_prompt), ensure_ascii=False),
            "completion": completion,
            "verdict": self.verdict,
            "error_type": self.error_type,
            "domain": self.request.domain,
            "trajectory_index": self.trajectory_index,
            "message_index": self.message_index,
            "request": json.dumps(asdict(self.request), ensure_ascii=False),
        }


def request_for(trajectory: Trajectory, message_index: int, action: dict[str, Any]) -> VerifyRequest:
    """The verification request of an action: the policy and the messages before it."""
    messages = trajectory.messages
    policy = messages[0].get("content", "") if messages and messages[0].get("role") == "system" else ""
    return VerifyRequest(trajectory.domain, str(policy), messages[:message_index], action)


VALID_ANSWERS = ("full", "verdict")
"""How a valid action's completion reads (``pipeline.critic_valid_answer``): ``full``, the whole
format (its explanation is the labeller's template, which says nothing the verdict does not), or
``verdict``, the VERDICT and ERROR lines alone, which :func:`~cast_rl.critique.rationale.parse_critique`
reads the same and a served critic writes in a tenth of the tokens (most actions are valid)."""


def examples_from_labels(
    labels: list[dict[str, Any]], trajectories: list[Trajectory], valid_answer: str = "full",
) -> tuple[list[Example], int]:
    """(examples, labels skipped because their rationale was dropped)."""
    if valid_answer not in VALID_ANSWERS:
        raise ValueError(f"valid_answer={valid_answer!r} is not allowed; choose one of {VALID_ANSWERS}")
    examples, skipped = [], 0
    for label in labels:
        t_index, m_index = label["trajectory_index"], label["message_index"]
        if not 0 <= t_index < len(trajectories):
            raise ValueError(f"label refers to trajectory {t_index}; the file has {len(trajectories)}")
        trajectory = trajectories[t_index]
        if not any(a.message_index == m_index for a in iter_actions(trajectory.messages)):
            raise ValueError(f"label refers to message {m_index} of trajectory {t_index}, "
                             "which is not an assistant action")
        if label["rationale"] is None:
            skipped += 1
            continue
        rationale = Rationale.from_json(label["rationale"])
        completion = ("VERDICT: valid\nERROR: none" if valid_answer == "verdict" and rationale.verdict == "valid"
                      else format_critique(rationale))
        examples.append(Example(
            request_for(trajectory, m_index, label["action"]), completion, label["verdict"],
            label["error_type"], t_index, m_index,
        ))
    return examples, skipped


def balance(examples: list[Example], rng: random.Random, valid_per_invalid: float = 1.0,
            per_action: bool = False) -> list[Example]:
    """``valid_per_invalid`` valid examples per invalid one, as far as the data allows (equal
    numbers by default; the larger class is subsampled).

    With ``per_action`` valid examples are drawn action by action first: each action name's invalid examples get up to
    ``valid_per_invalid`` valid ones of the same action (a valid cancel beside the invalid ones),
    and the rest of the valid quota comes from every action.  Drawn at random, valid examples are
    mostly replies and lookups, and a critic that has seen the action it must judge only when it
    was wrong learns to flag the action, not the error: 143 invalid cancels against 17 valid ones
    made the quickstart's critic flag every second valid cancel in the loop.
    """
    valid = [e for e in examples if e.verdict == "valid"]
    invalid = [e for e in examples if e.verdict == "invalid"]
    if not valid or not invalid:
        logger.warning("cannot balance: %d valid and %d invalid examples", len(valid), len(invalid))
        return examples
    n_invalid = min(len(invalid), max(1, math.ceil(len(valid) / valid_per_invalid)))
    n_valid = min(len(valid), round(valid_per_invalid * n_invalid))
    if not per_action:
        keep = rng.sample(valid, n_valid) + rng.sample(invalid, n_invalid)
        return sorted(keep, key=lambda e: (e.trajectory_index, e.message_index))
    chosen_invalid = rng.sample(invalid, n_invalid)
    by_action: dict[str, list[Example]] = {}
    for e in valid:
        by_action.setdefault(_action_name(e), []).append(e)
    wanted = Counter(_action_name(e) for e in chosen_invalid)
    chosen_valid: list[Example] = []
    for name in sorted(wanted):
        pool = by_action.get(name, [])
        chosen_valid += rng.sample(pool, min(len(pool), round(valid_per_invalid * wanted[name])))
    taken = {id(e) for e in chosen_valid}
    rest = [e for e in valid if id(e) not in taken]
    if len(chosen_valid) > n_valid:
        chosen_valid = rng.sample(chosen_valid, n_valid)
    else:
        chosen_valid += rng.sample(rest, n_valid - len(chosen_valid))
    return sorted(chosen_valid + chosen_invalid, key=lambda e: (e.trajectory_index, e.message_index))


def _action_name(example: Example) -> str:
    return str(example.request.proposal.get("name", ""))


def _heldout(trajectory_index: int, fraction: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{trajectory_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def build_critic_data(
    labels_path: str | Path,
    trajectories_path: str | Path,
    out_dir: str | Path,
    heldout_fraction: float = 0.2,
    seed: int = 0,
    drop_from_train: set[tuple[int, int]] | frozenset[tuple[int, int]] = frozenset(),
    valid_answer: str = "full",
    valid_per_invalid: float = 1.0,
    aliases: EntityAliases | None = None,
    per_action: bool = False,
    twins_of: DomainData | None = None,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
    system_prompt: bool = True,
) -> dict[str, Any]:
    """Write ``train.parquet`` and ``heldout.parquet``; returns counts for a summary.

    ``aliases``, ``max_prompt_chars`` and ``system_prompt``: the critic's
    ``critic.model.entity_aliases``, ``critic.max_prompt_chars`` and ``critic.system_prompt``
    (:meth:`Example.row`: the prompts read as the served critic's will);
    ``per_action``: ``pipeline.critic_balance=per_action`` (:func:`balance`) for the training
    split; the held-out split is always drawn per action.

    ``twins_of``: the domain data of the labelled trajectories, to add to the training split the
    argument twins (:mod:`cast_rl.critique.twins`) of every write it keeps (``pipeline.critic_twins``);
    None adds none.  The held-out split never has twins.

    ``valid_per_invalid``: valid examples per invalid one in the training split (a critic in the
    loop sees mostly valid actions, and each false flag costs a revision); the held-out split stays
    balanced, so its metrics compare across ratios.

    ``drop_from_train``: ``(trajectory_index, message_index)`` of labels to leave out of the
    training split (e.g. invalid labels verified blame did not confirm); the held-out split
    keeps them, so held-out metrics of critics trained with and without the filter compare.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction} is not allowed; use 0 <= f < 1")
    if valid_per_invalid <= 0:
        raise ValueError(f"valid_per_invalid={valid_per_invalid} is not allowed; it must be > 0")
    labels = read_labels(labels_path)
    trajectories = read_trajectories(trajectories_path)
    examples, skipped = examples_from_labels(labels, trajectories, valid_answer)
    rng = random.Random(seed)
    splits = {
        "train": [e for e in examples if not _heldout(e.trajectory_index, heldout_fraction, seed)
                  and (e.trajectory_index, e.message_index) not in drop_from_train],
        "heldout": [e for e in examples if _heldout(e.trajectory_index, heldout_fraction, seed)],
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"labels": len(labels), "skipped_no_rationale": skipped}
    if drop_from_train:
        summary["dropped_from_train"] = sum(
            1 for e in examples if (e.trajectory_index, e.message_index) in drop_from_train
            and not _heldout(e.trajectory_index, heldout_fraction, seed))
    for name, rows in splits.items():
        # the held-out split always draws its valid examples action by action, so that its
        # false-positive rate is measured on the actions the errors are (a valid cancel), not
        # mostly on replies and lookups
        kept = balance(rows, rng, valid_per_invalid if name == "train" else 1.0, per_action or name == "heldout")
        twins = _twins(twins_of, kept, trajectories, valid_answer) if name == "train" and twins_of else []
        table = pa.Table.from_pylist([e.row(aliases, max_prompt_chars, system_prompt) for e in kept + twins], schema=_schema())
        pq.write_table(table, out / f"{name}.parquet")
        counts = Counter(e.verdict for e in kept + twins)
        summary[name] = {"examples": len(kept) + len(twins), "valid": counts["valid"], "invalid": counts["invalid"]}
        if twins_of is not None and name == "train":
            summary[name]["twins"] = len(twins)
    return summary


def build_configured_critic_data(
    cfg: Any, labels_path: str | Path, trajectories_path: str | Path, out_dir: str | Path,
    data: DomainData | None = None, drop_from_train: set[tuple[int, int]] | frozenset[tuple[int, int]] = frozenset(),
) -> dict[str, Any]:
    """:func:`build_critic_data` with the options a :class:`~cast_rl.config.Config` names
    (``pipeline.critic_*``, ``seed``, and the served critic's ``critic.model.entity_aliases``,
    ``critic.max_prompt_chars`` and ``critic.system_prompt``), so that stage critic_data and ``cast-rl critic build-data``
    write the same data, as the critic that ``cfg`` serves reads it.  ``data``: the labelled
    trajectories' domain data for ``pipeline.critic_twins`` (loaded from ``cfg`` when None)."""
    pipe = cfg.pipeline
    if pipe.critic_twins and data is None:
        from cast_rl.envs.setup import load_env_data

        data = load_env_data(cfg)
    return build_critic_data(
        labels_path, trajectories_path, out_dir, heldout_fraction=pipe.critic_heldout_fraction, seed=cfg.seed,
        drop_from_train=drop_from_train, valid_answer=pipe.critic_valid_answer,
        valid_per_invalid=pipe.critic_valid_per_invalid, per_action=pipe.critic_balance == "per_action",
        twins_of=data if pipe.critic_twins else None, **served_prompt(cfg.critic),
    )


def _twins(data: DomainData, kept: list[Example], trajectories: list[Trajectory], valid_answer: str) -> list[Example]:
    """The labelled argument twins of the writes in ``kept``, each under its source's trajectory
    index (a twin differs from its source in one argument only)."""
    sources = [{"trajectory_index": e.trajectory_index, "message_index": e.message_index,
                "action": e.request.proposal} for e in kept]
    out: list[Example] = []
    for position, trajectory, label in twin_labels(data, trajectories, sources):
        examples, _ = examples_from_labels([label], [trajectory], valid_answer)
        out += [replace(e, trajectory_index=kept[position].trajectory_index) for e in examples]
    return out


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("prompt_messages", pa.string()), ("completion", pa.string()), ("verdict", pa.string()),
        ("error_type", pa.string()), ("domain", pa.string()), ("trajectory_index", pa.int64()),
        ("message_index", pa.int64()), ("request", pa.string()),
    ])


def read_requests(path: str | Path) -> list[tuple[VerifyRequest, str, str]]:
    """(request, true verdict, true error type) of every row of a critic Parquet file."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path, columns=["request", "verdict", "error_type"]).to_pylist()
    return [(VerifyRequest(**json.loads(r["request"])), r["verdict"], r["error_type"]) for r in rows]
