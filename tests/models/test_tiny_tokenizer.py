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
