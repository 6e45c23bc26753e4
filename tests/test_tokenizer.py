"""Tokenizer tests: a synthetic byte-level vocabulary, and golden ids from llama.cpp.

The golden fixtures (tests/fixtures/tokenizer_golden_*.json) were produced by
perf/make_tokenizer_golden.py with llama.cpp's llama-tokenize; these tests only need the
fixtures and the real model files (fetched from the package index on first use).
"""

import json
import os

import numpy as np
import pytest

from llcinfer.errors import TokenizerError
from llcinfer.model.tokenizer import _PRE_TYPES, Tokenizer, _byte_decoder

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
GOLDEN = {"smollm": "smollm2-135m", "qwen2": "qwen2.5-coder-0.5b"}  # fixture vocab -> model file


from real_models import real_model_path as model_path  # fetched on first use, never skipped


# ---------------------------------------------------------------- synthetic vocabulary
BYTE_CHARS = sorted(_byte_decoder(), key=lambda c: _byte_decoder()[c])  # index == byte value


def synthetic_meta(**overrides) -> dict:
    """A tiny GPT-2 style vocabulary: 256 byte tokens, a few merges, control/user tokens."""
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ in"]
    merged = ["Ġt", "he", "Ġthe", "in", "Ġin"]
    tokens = BYTE_CHARS + merged + ["<|end|>", "<|bos|>", "<tool>", "<|eot_id|>"]
    types = [1] * (256 + len(merged)) + [3, 3, 4, 1]
    meta = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|bos|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|end|>"),
    }
    meta.update(overrides)
    return meta


@pytest.fixture(scope="module")
def tiny():
    return Tokenizer.from_metadata(synthetic_meta())


def test_synthetic_merges_and_roundtrip(tiny):
    ids = tiny.encode(" the in")
    assert [tiny.token_text(i) for i in ids] == ["Ġthe", "Ġin"]
    for text in ["", " ", "héllo wörld", "日本語", "👨‍👩‍👧", "a\r\n\tb  c", "\x00\x7f"]:
        assert tiny.decode(tiny.encode(text)) == text


def test_control_tokens_only_parsed_when_special(tiny):
    end = tiny.encode("<|end|>", special=True)
    assert end == [tiny.eos_id]
    plain = tiny.encode("<|end|>")
    assert len(plain) == len("<|end|>") and tiny.decode(plain) == "<|end|>"
    # user-defined tokens are always matched; they decode to their text
    tool_ids = tiny.encode("<tool>")
    assert len(tool_ids) == 1 and tiny.token_text(tool_ids[0]) == "<tool>"
    assert tiny.encode("x<tool>y") == tiny.encode("x") + tool_ids + tiny.encode("y")
    assert tiny.decode(tiny.encode("a<tool>b")) == "a<tool>b"


def test_control_tokens_decode_to_nothing(tiny):
    ids = tiny.encode("hi<|end|>", special=True)
    assert tiny.decode(ids) == "hi"
    assert tiny.decode(ids, special=True) == "hi<|end|>"
    assert tiny.token_bytes(tiny.eos_id) == b""


def test_bos_eos_and_eog(tiny):
    assert tiny.add_bos is False
    assert tiny.encode("a", add_bos=True) == [tiny.bos_id, tiny.encode("a")[0]]
    assert tiny.encode("a", add_eos=True)[-1] == tiny.eos_id
    eot = tiny.encode("<|eot_id|>", special=True)
    assert len(eot) == 1  # promoted to a control token, as llama.cpp does
    assert tiny.eog_ids == frozenset({tiny.eos_id, eot[0]})
    tok = Tokenizer.from_metadata(synthetic_meta(**{"tokenizer.ggml.add_bos_token": True}))
    assert tok.add_bos and tok.encode("a")[0] == tok.bos_id and tok.encode("a", add_bos=False)[0] != tok.bos_id


def test_stream_decoder_holds_back_partial_utf8(tiny):
    text = "a😀b日"
    ids = tiny.encode(text)
    assert len(ids) == 1 + 4 + 1 + 3  # every byte is its own token in this vocabulary
    dec = tiny.stream_decoder()
    pieces = [dec.push(i) for i in ids]
    assert pieces == ["a", "", "", "", "😀", "b", "", "", "日"]
    assert dec.flush() == ""
    dec.push(ids[1])
    dec.push(ids[2])
    assert dec.flush() == "\ufffd"


def test_token_id_validation(tiny):
    for bad in (-1, tiny.vocab_size, 10**9):
        with pytest.raises(TokenizerError):
            tiny.token_bytes(bad)
        with pytest.raises(TokenizerError):
            tiny.decode([0, bad])
    with pytest.raises(TokenizerError):
        tiny.token_text("3")
    assert tiny.decode(np.array(tiny.encode("hi"), dtype=np.int32)) == "hi"


@pytest.mark.parametrize("pre", sorted(_PRE_TYPES))
def test_every_pre_type_builds_and_roundtrips(pre):
    tok = Tokenizer.from_metadata(synthetic_meta(**{"tokenizer.ggml.pre": pre}))
    text = "I'M here: 12345 日本語  x\r\n\n\ty 😀"
    assert tok.decode(tok.encode(text, add_bos=False)) == text
    assert tok.add_bos == (pre in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                   "midm-2.0", "lfm2", "tekken"))


@pytest.mark.parametrize("overrides, fragment", [
    ({"tokenizer.ggml.model": "llama"}, "'llama'"),
    ({"tokenizer.ggml.model": "bert"}, "'bert'"),
    ({"tokenizer.ggml.pre": "no-such-pre"}, "'no-such-pre'"),
    ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.merges": ["Ġt he", "x y"]}, "inconsistent"),
    ({"tokenizer.ggml.pre": "é" * 3000}, "'éééé"),  # a long value is cut short
    ({"tokenizer.ggml.merges": ["Ġt he", "x" * 3000]}, "malformed BPE merge 'xxxx"),
])
def test_unsupported_vocabularies(overrides, fragment):
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_metadata(synthetic_meta(**overrides))
    msg = str(info.value)
    assert fragment in msg and "\n" not in msg and len(msg) < 200


# ---------------------------------------------------------------- real vocabularies
_CACHE: dict = {}


def real_tokenizer(vocab: str) -> Tokenizer:
    """The tokenizer of a catalog model (loaded once per test session)."""
    if vocab not in _CACHE:
        from llcinfer.model.gguf_file import GGUFFile

        _CACHE[vocab] = Tokenizer.from_metadata(GGUFFile(model_path(GOLDEN[vocab])).metadata)
    return _CACHE[vocab]


def golden_records(vocab: str) -> list[dict]:
    path = os.path.join(FIXTURES, f"tokenizer_golden_{vocab}.json")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)["records"]


@pytest.mark.parametrize("vocab", sorted(GOLDEN))
def test_golden_ids_match_llama_cpp(vocab):
    records = golden_records(vocab)
    tok = real_tokenizer(vocab)
    mismatches = [(r["text"], r["special"], r["ids"], tok.encode(r["text"], special=r["special"]))
                  for r in records if tok.encode(r["text"], special=r["special"]) != r["ids"]]
    assert not mismatches, f"{len(mismatches)}/{len(records)} differ, first: {mismatches[0]}"


@pytest.mark.parametrize("vocab", sorted(GOLDEN))
def test_decode_roundtrip(vocab):
    tok = real_tokenizer(vocab)
    for r in golden_records(vocab):
        if not r["special"]:
            assert tok.decode(tok.encode(r["text"])) == r["text"]


@pytest.mark.parametrize("vocab", sorted(GOLDEN))
def test_stream_decoder_on_real_vocab(vocab):
    tok = real_tokenizer(vocab)
    texts = ["family 👨‍👩‍👧‍👦 and flags 🇺🇸🇯🇵", "日本語のテキストです。", "한국어 👍🏽 ❤️ 1️⃣", "中文测试：你好，世界！"]
    for text in texts:
        ids = tok.encode(text)
        dec = tok.stream_decoder()
        pieces = [dec.push(i) for i in ids] + [dec.flush()]
        assert all("\ufffd" not in p for p in pieces)
        assert "".join(pieces) == tok.decode(ids) == text


@pytest.mark.parametrize("vocab, eos_text", [("smollm", "<|im_end|>"), ("qwen2", "<|im_end|>")])
def test_real_vocab_special_ids(vocab, eos_text):
    tok = real_tokenizer(vocab)
    assert tok.token_text(tok.eos_id) == eos_text
    assert tok.eos_id in tok.eog_ids
    assert tok.encode("<|endoftext|>", special=True)[0] in tok.eog_ids
    assert tok.add_bos is False
    im_start = tok.encode("<|im_start|>", special=True)
    assert len(im_start) == 1 and tok.decode(im_start) == ""
