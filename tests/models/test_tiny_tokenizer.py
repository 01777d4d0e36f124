"""The tiny model's domain tokenizer: ``model.tiny.whole_tokens`` keeps identifiers whole."""

from __future__ import annotations

import pytest

from cast_rl.config import load_config
from cast_rl.config.schema import TinyConfig
from cast_rl.models.tiny import train_tokenizer

CORPUS = [
    '{"#W7706143": {"user_id": "sami_zhou_8461", "email": "sami.zhou2041@example.com"}}',
    '{"#W2378156": {"user_id": "noah_brown_6181", "email": "noah.brown7922@example.com"}}',
    "Cancel order #W7706143 because it was ordered by mistake.",
]
PATTERNS = [r"#W\d{7}", r"[\w.]+@example\.com", r"\b[a-z]+_[a-z]+_\d{4}\b"]


def test_every_match_in_the_corpus_becomes_one_token() -> None:
    plain = train_tokenizer(CORPUS, 600)
    whole = train_tokenizer(CORPUS, 600, PATTERNS)
    text = 'I want to cancel #W2378156, my email is noah.brown7922@example.com ({"user_id": "sami_zhou_8461"})'
    assert len(plain.tokenize("#W2378156")) > 1  # BPE alone splits an id into digit pieces
    for ident in ("#W2378156", "noah.brown7922@example.com", "sami_zhou_8461"):
        assert whole.tokenize(ident) == [ident]
        assert ident in whole.tokenize(text)
    assert whole.decode(whole(text)["input_ids"]) == text  # ordinary tokens: they decode as text
    assert len(whole) == len(plain) + 6  # the six distinct matches, nothing else
    # an identifier the corpus never held stays in pieces (a fabricated id is not a token)
    assert len(whole.tokenize("#W7706144")) > 1


def test_a_bad_pattern_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"model.tiny.whole_tokens.*not a regular expression"):
        TinyConfig(whole_tokens=["#W(\\d"])
    cfg = load_config(None, ["policy.tiny.whole_tokens=['#W\\d{7}']"])
    assert cfg.policy.tiny.whole_tokens == ["#W\\d{7}"]


def test_policy_aliases_are_single_trainable_tokens(tmp_path) -> None:  # noqa: ANN001
    import json

    from cast_rl.config.schema import ModelConfig
    from cast_rl.models.setup import ensure_model

    model = ModelConfig(path=str(tmp_path / "policy"), entity_aliases={"order": r"#W\d{7}", "email": r"\S+@example\.com"},
                        tiny=TinyConfig(whole_tokens=[r"\b[a-z]+_[a-z]+_\d{4}\b"]))
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "db.json").write_text(CORPUS[0])
    path = ensure_model(model, [tmp_path / "corpus"])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    assert tok.tokenize('{"order_id": "[order_1]", "email": "[email_8]"}').count("[order_1]") == 1
    assert tok.tokenize("[email_8]") == ["[email_8]"] and len(tok.tokenize("[order_9]")) > 1
    frozen = json.loads((path / "config.json").read_text())["frozen_token_ids"]
    assert frozen == [tok.convert_tokens_to_ids("sami_zhou_8461")]  # whole tokens frozen, aliases trained


def test_split_digits_leaves_no_database_number_in_the_vocabulary() -> None:
    corpus = CORPUS * 50  # frequent enough that plain BPE merges the ids' digits
    plain = train_tokenizer(corpus, 600)
    split = train_tokenizer(corpus, 600, split_digits=True)
    assert any(len(t.strip("Ġ#W")) > 1 and t.strip("Ġ#W").isdigit() for t in plain.get_vocab())
    assert not any(sum(c.isdigit() for c in t) > 1 for t in split.get_vocab())
    assert split.tokenize("#W7706143")[-7:] == list("7706143")
    text = "order #W1234567 costs 250.50, zip 48218"
    assert split.decode(split(text)["input_ids"]) == text
