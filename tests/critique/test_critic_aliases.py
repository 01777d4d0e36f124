"""``critic.model.entity_aliases``: a model critic reads the conversation's identifiers as the
aliased policy does, is trained on data written the same way, and its answers are mapped back.

What a critic learns must not be tied to one database's identifiers: with aliases, a critic trained
on one generated database reads an unseen one's orders and e-mails as ``[order_1]`` and
``[email_1]``, as in training.  The engine is a stand-in that records its prompt and answers with
a fixed text: what is tested is what the critic reads, what it is trained on, and what the policy
is shown.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pyarrow.parquet as pq
import pytest

from cast_rl.config import load_config
from cast_rl.critique.datasets import Example, build_critic_data
from cast_rl.critique.prompt import aliased, critic_messages
from cast_rl.critique.records import VerifyRequest
from cast_rl.critique.service import build_verifier
from cast_rl.inference.base import Completion
from cast_rl.models.aliases import EntityAliases
from cast_rl.records import Trajectory, write_trajectories

PATTERNS = {"order": r"#W\d{7}", "email": r"[a-z0-9._]+@example\.com"}
MESSAGES = [
    {"role": "system", "content": "Policy: confirm before cancelling."},
    {"role": "user", "content": "Cancel #W1234567 please, I am ana.lee@example.com."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "find_user_id_by_email", "arguments": '{"email": "ana.lee@example.com"}'}}]},
    {"role": "tool", "name": "find_user_id_by_email", "content": "ana_lee_1234"},
]
ANSWER = ('VERDICT: invalid\nERROR: policy_violation\nCLAUSE: none\nEVIDENCE: 1 "Cancel [order_1] please"\n'
          "EXPLANATION: [order_1] is cancelled without an explicit yes.\nFIX: Ask before cancelling [order_1].")


def _request(order: str = "#W1234567") -> VerifyRequest:
    return VerifyRequest("retail", "Policy: confirm before cancelling.", MESSAGES,
                         {"name": "cancel_pending_order", "kwargs": {"order_id": order, "reason": "no longer needed"}})


class RecordingEngine:
    def __init__(self) -> None:
        self.prompts: list[list[dict[str, Any]]] = []
        self.model_path = "recording-critic"

    async def chat(self, messages, sampling, tools=None) -> Completion:  # noqa: ANN001
        self.prompts.append(messages)
        return Completion(text=ANSWER)

    async def close(self) -> None:
        pass


def test_the_critic_reads_aliases_and_a_never_shown_id_stays_real() -> None:
    aliases = EntityAliases(PATTERNS)
    view, table = aliased(_request(), aliases)
    assert table is not None and table.to_real == {"[order_1]": "#W1234567", "[email_1]": "ana.lee@example.com"}
    assert view.messages[1]["content"] == "Cancel [order_1] please, I am [email_1]."
    assert view.proposal["kwargs"] == {"order_id": "[order_1]", "reason": "no longer needed"}
    text = json.dumps(critic_messages(view))
    assert "#W1234567" not in text and "ana.lee@example.com" not in text
    # an order the conversation never showed (a hallucination) is what the critic must see as such
    made_up, _ = aliased(_request("#W7654321"), aliases)
    assert made_up.proposal["kwargs"]["order_id"] == "#W7654321"
    assert aliased(_request(), None) == (_request(), None)


def test_served_critic_prompt_is_the_training_prompt_and_its_answer_is_mapped_back(tmp_path) -> None:  # noqa: ANN001
    cfg = load_config(None, ["critic.backend=model", f"critic.model.entity_aliases={json.dumps(PATTERNS)}"])
    engine = RecordingEngine()
    verifier = build_verifier(cfg.critic, engine=engine)
    [critique] = asyncio.run(verifier.verify([_request()]))
    # the policy is shown the real identifiers, and the rationale holds them
    assert critique.verdict == "invalid" and "[order_1]" not in critique.text
    assert "#W1234567 is cancelled without an explicit yes." in critique.text
    assert critique.rationale["evidence"] == [{"message_index": 1, "quote": "Cancel #W1234567 please"}]
    # training writes the prompt the served critic reads, and the labeller's answer aliased
    real = ANSWER.replace("[order_1]", "#W1234567")
    row = Example(_request(), real, "invalid", "policy_violation", 0, 4).row(EntityAliases(PATTERNS))
    assert json.loads(row["prompt_messages"]) == engine.prompts[0]
    assert row["completion"] == ANSWER
    assert VerifyRequest(**json.loads(row["request"])) == _request()  # held-out metrics ask with real ids
    # without aliases nothing changes
    plain = load_config(None, ["critic.backend=model"])
    engine = RecordingEngine()
    asyncio.run(build_verifier(plain.critic, engine=engine).verify([_request()]))
    assert "#W1234567" in json.dumps(engine.prompts[0])


def test_critic_data_is_written_aliased(tmp_path) -> None:  # noqa: ANN001
    messages = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c2", "type": "function", "function": {
            "name": "cancel_pending_order",
            "arguments": '{"order_id": "#W1234567", "reason": "no longer needed"}'}}]}]
    trajectories = tmp_path / "trajectories.jsonl"
    write_trajectories(trajectories, [Trajectory("retail", "train", 0, 0, 0.0, 0, messages=messages)])
    label = {"trajectory_index": 0, "message_index": 4,
             "action": {"name": "cancel_pending_order", "kwargs": {"order_id": "#W1234567", "reason": "no longer needed"}},
             "verdict": "invalid", "error_type": "policy_violation",
             "rationale": {"verdict": "invalid", "error_type": "policy_violation", "evidence": [],
                           "policy_clause": "", "explanation": "#W1234567 is cancelled without an explicit yes.",
                           "suggested_fix": ""}}
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps(label) + "\n")
    build_critic_data(labels, trajectories, tmp_path / "data", heldout_fraction=0.0, aliases=EntityAliases(PATTERNS))
    [row] = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    assert "[order_1] is cancelled" in row["completion"] and "#W1234567" not in row["prompt_messages"]


def test_per_action_balance_draws_valid_examples_of_the_flagged_action() -> None:
    """``pipeline.critic_balance=per_action``: the invalid cancels get valid cancels beside them;
    drawn at random from mostly replies, the critic would see a cancel almost only when wrong."""
    import random

    from cast_rl.critique.datasets import balance

    def example(name: str, verdict: str, i: int) -> Example:
        request = VerifyRequest("retail", "", [], {"name": name, "kwargs": {}})
        return Example(request, "", verdict, "none" if verdict == "valid" else "policy_violation", i, 1)

    examples = ([example("cancel_pending_order", "invalid", i) for i in range(10)]
                + [example("cancel_pending_order", "valid", 100 + i) for i in range(10)]
                + [example("respond", "valid", 200 + i) for i in range(90)])
    per_action = balance(examples, random.Random(0), 2.0, per_action=True)
    cancels = [e for e in per_action if e.verdict == "valid" and e.request.proposal["name"] == "cancel_pending_order"]
    assert len(cancels) == 10 and sum(e.verdict == "valid" for e in per_action) == 20
    drawn = balance(examples, random.Random(0), 2.0)
    assert sum(e.verdict == "valid" for e in drawn) == 20
    assert sum(e.verdict == "valid" and e.request.proposal["name"] == "cancel_pending_order" for e in drawn) < 10


def test_the_heldout_split_draws_valid_examples_per_action_whatever_the_training_balance(tmp_path) -> None:  # noqa: ANN001
    """Drawn at random, a held-out split of 10 invalid cancels, 10 valid ones and 90 valid replies
    measures its false-positive rate mostly on replies; the held-out split always takes the valid
    cancels first, so a critic that flags every cancel shows it there."""
    cancel = {"name": "cancel_pending_order", "kwargs": {"order_id": "#W1234567", "reason": "no longer needed"}}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "type": "function", "function": {
        "name": cancel["name"], "arguments": json.dumps(cancel["kwargs"])}}]}
    reply = {"role": "assistant", "content": "Anything else?"}
    kinds = [("cancel", "invalid")] * 10 + [("cancel", "valid")] * 10 + [("reply", "valid")] * 90
    write_trajectories(tmp_path / "t.jsonl", [
        Trajectory("retail", "train", 0, i, 0.0, 0, messages=[*MESSAGES, call if kind == "cancel" else reply])
        for i, (kind, _) in enumerate(kinds)])
    with (tmp_path / "l.jsonl").open("w") as f:
        for i, (kind, verdict) in enumerate(kinds):
            action = cancel if kind == "cancel" else {"name": "respond", "kwargs": {"content": "Anything else?"}}
            error = "none" if verdict == "valid" else "policy_violation"
            f.write(json.dumps({"trajectory_index": i, "message_index": 4, "action": action, "verdict": verdict,
                                "error_type": error, "rationale": {"verdict": verdict, "error_type": error}}) + "\n")
    build_critic_data(tmp_path / "l.jsonl", tmp_path / "t.jsonl", tmp_path / "data", heldout_fraction=0.99)
    rows = pq.read_table(tmp_path / "data" / "heldout.parquet").to_pylist()
    valid = [json.loads(r["request"])["proposal"]["name"] for r in rows if r["verdict"] == "valid"]
    invalid = [r for r in rows if r["verdict"] == "invalid"]
    assert len(valid) == len(invalid) >= 8 and set(valid) == {"cancel_pending_order"}


@pytest.mark.parametrize("system_prompt", [True, False])
def test_cli_build_data_writes_the_prompt_the_served_critic_reads(tmp_path, capsys, system_prompt: bool) -> None:  # noqa: ANN001
    """``cast-rl critic build-data`` writes its prompts as the served critic of the same config
    asks: aliased (``critic.model.entity_aliases``), cut to ``critic.max_prompt_chars`` (the
    oldest messages first) and with or without the critic's instructions and the policy
    (``critic.system_prompt``).  Written with the defaults instead, a critic trained on them would
    read real ids and a whole transcript it is never shown when served."""
    from cast_rl.cli import main

    messages = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c2", "type": "function", "function": {
            "name": "cancel_pending_order",
            "arguments": '{"order_id": "#W1234567", "reason": "no longer needed"}'}}]}]
    write_trajectories(tmp_path / "t.jsonl", [Trajectory("retail", "train", 0, 0, 0.0, 0, messages=messages)])
    label = {"trajectory_index": 0, "message_index": 4, "action": _request().proposal, "verdict": "invalid",
             "error_type": "policy_violation",
             "rationale": {"verdict": "invalid", "error_type": "policy_violation", "evidence": [], "policy_clause": "",
                           "explanation": "#W1234567 is cancelled without an explicit yes.", "suggested_fix": ""}}
    (tmp_path / "l.jsonl").write_text(json.dumps(label) + "\n")
    overrides = ["critic.backend=model", f"critic.model.entity_aliases={json.dumps(PATTERNS)}",
                 "critic.max_prompt_chars=150", "pipeline.critic_heldout_fraction=0.0",
                 f"critic.system_prompt={str(system_prompt).lower()}"]
    assert main(["critic", "build-data", *overrides, "--labels", str(tmp_path / "l.jsonl"),
                 "--trajectories", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "data")]) == 0
    capsys.readouterr()
    [row] = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    engine = RecordingEngine()
    asyncio.run(build_verifier(load_config(None, overrides).critic, engine=engine).verify(
        [VerifyRequest(**json.loads(row["request"]))]))
    assert json.loads(row["prompt_messages"]) == engine.prompts[0]
    shown = engine.prompts[0][-1]["content"]
    assert "(earlier messages omitted)" in shown and "[order_1]" in shown and "#W1234567" not in shown
    roles = [m["role"] for m in engine.prompts[0]]
    policy = "Policy: confirm before cancelling." in json.dumps(engine.prompts[0])
    assert (roles, policy) == ((["system", "user"], True) if system_prompt else (["user"], False))
    assert shown.endswith('call cancel_pending_order({"order_id": "[order_1]", "reason": "no longer needed"})')


def test_the_served_critics_default_transcript_is_its_training_datas() -> None:
    """``critic.max_prompt_chars``'s default (the config layer imports nothing of cast_rl.critique)
    is the length the data builder and the critic prompt fall back to."""
    from cast_rl.config.critic import CriticConfig, TeacherConfig
    from cast_rl.critique.prompt import MAX_PROMPT_CHARS

    assert CriticConfig().max_prompt_chars == TeacherConfig().max_prompt_chars == MAX_PROMPT_CHARS


def test_served_prompt_gives_the_data_builder_what_the_critic_reads_served(tmp_path) -> None:  # noqa: ANN001
    """The served critic and the data builders (the pipeline's, and the benches that build
    critic data themselves: blame_filter, critic_smollm2, the verdict probe) take their prompt
    options from ``served_prompt``."""
    from cast_rl.critique.prompt import served_prompt

    cfg = load_config(None, [f"critic.model.entity_aliases={json.dumps(PATTERNS)}", "critic.max_prompt_chars=600",
                             "critic.system_prompt=false"])
    options = served_prompt(cfg.critic)
    assert (options["max_prompt_chars"], options["system_prompt"]) == (600, False)
    assert options["aliases"].apply(MESSAGES)[0][1]["content"] == "Cancel [order_1] please, I am [email_1]."
    assert served_prompt(load_config(None, []).critic) == {"aliases": None, "max_prompt_chars": 24_000,
                                                         "system_prompt": True}
