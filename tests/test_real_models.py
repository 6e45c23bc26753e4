"""The fast path against the NumPy oracle on the real catalog models."""

import numpy as np
import pytest
from real_models import real_gguf, real_model_path

from llcinfer.engine.loop import Engine
from llcinfer.engine.transformer import Transformer
from llcinfer.engine.reference import ReferenceModel
from llcinfer.engine.sampling import SamplingParams
from llcinfer.model.tokenizer import Tokenizer

TEXT = (
    "The history of computing is longer than the history of computing hardware and modern "
    "computing technology and includes the history of methods intended for pen and paper or "
    "for chalk and slate, with or without the aid of tables. Digital computing is intimately "
    "tied to the representation of numbers. But long before abstractions like the number arose, "
    "there were mathematical concepts to serve the purposes of civilization."
)


@pytest.fixture(scope="module")
def smollm2():
    """Exact-float mode on both sides: the oracle check of the kernels."""
    f = real_gguf("smollm2-135m")
    return f, Transformer(f, llama_rounding=False), ReferenceModel(f, llama_rounding=False), Tokenizer.from_metadata(f.metadata)


def _prompt(tok, n):
    ids = tok.encode(TEXT)
    assert len(ids) >= n
    return ids[:n]


def test_smollm2_logits_match_oracle_over_64_tokens(smollm2):
    f, model, ref, tok = smollm2
    ids = _prompt(tok, 64)
    fast = model.forward(ids, model.new_cache(128), all_logits=True)  # [64, vocab]
    oracle = ref.logits(ids)
    assert fast.shape == oracle.shape == (64, model.config.vocab_size)
    np.testing.assert_array_equal(fast.argmax(-1), oracle.argmax(-1))
    scale = np.abs(oracle).max()
    assert np.abs(fast - oracle).max() < 1e-4 * scale


def test_smollm2_incremental_decode_matches_batch(smollm2):
    f, model, ref, tok = smollm2
    ids = _prompt(tok, 40)
    batch = model.forward(ids, model.new_cache(64), all_logits=True)
    cache = model.new_cache(64)
    model.forward(ids[:33], cache)
    for i in range(33, 40):
        step = model.forward(ids[i:i + 1], cache)
        assert np.abs(step - batch[i]).max() < 1e-4 * np.abs(batch[i]).max()


def test_smollm2_greedy_32_tokens_equal_oracle(smollm2):
    f, model, ref, tok = smollm2
    prompt = _prompt(tok, 24)
    engine = Engine(model, tok, n_ctx=128, step_tokens=16)
    fast = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0].token_ids
    seq = list(prompt)
    for _ in range(32):
        seq.append(int(ref.logits(seq)[-1].argmax()))
    assert fast == seq[len(prompt):]


def test_qwen2_real_weights_match_oracle():
    """Qwen2.5-Coder-0.5B: qwen2 biases, NEOX rope, Q5_0 / Q8_0 / Q4_K / Q6_K tensors."""
    f = real_gguf("qwen2.5-coder-0.5b")
    model = Transformer(f, llama_rounding=False)
    tok = Tokenizer.from_metadata(f.metadata)
    ids = tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n")[:24]
    fast = model.forward(ids, model.new_cache(32), all_logits=True)
    oracle = ReferenceModel(f, llama_rounding=False).logits(ids)
    np.testing.assert_array_equal(fast.argmax(-1), oracle.argmax(-1))
    assert np.abs(fast - oracle).max() < 1e-4 * np.abs(oracle).max()


def test_llama_rounding_mode_tracks_its_oracle(smollm2):
    """With llama.cpp's activation rounding on both sides, a float32-vs-float64 difference
    can move a value across a rounding boundary, so the two drift apart slightly; they must
    still agree on the top token almost everywhere and stay close."""
    f, _, _, tok = smollm2
    ids = _prompt(tok, 64)
    model = Transformer(f, llama_rounding=True)
    fast = model.forward(ids, model.new_cache(128), all_logits=True)
    oracle = ReferenceModel(f, llama_rounding=True).logits(ids)
    assert (fast.argmax(-1) == oracle.argmax(-1)).mean() >= 0.9
    assert np.median(np.abs(fast - oracle).max(-1)) < 0.05 * np.abs(oracle).max()


def test_llm_api_on_default_model():
    from llcinfer import LLM

    llm = LLM("smollm2-135m", threads=2, n_ctx=512)
    assert str(llm.model_path) == real_model_path("smollm2-135m")
    a = llm.generate("The capital of France is", max_tokens=12, temperature=0)
    b = "".join(llm.stream("The capital of France is", max_tokens=12, temperature=0))
    assert a == b and len(a) > 0
    assert llm.last_stats.n_prompt_evaluated == 1  # the prompt came from the cache
    s1 = llm.generate("Once upon a time", max_tokens=16, temperature=0.9, seed=42)
    s2 = llm.generate("Once upon a time", max_tokens=16, temperature=0.9, seed=42)
    assert s1 == s2
    reply = llm.chat([{"role": "user", "content": "Name a colour."}], max_tokens=40, temperature=0)
    assert reply.strip() and "<|im" not in reply
    assert llm.last_stats.stop_reason in ("eos", "length")
    ids = llm.tokenize("<|im_start|>user", special=True)
    assert ids[0] == llm.tokenizer.encode("<|im_start|>", special=True)[0] and llm.detokenize(ids) == "user"
    logits = llm.logits(llm.tokenize("Hello"))
    assert logits.dtype == np.float32 and logits.shape == (llm.config.vocab_size,)
    stopped = llm.generate("1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[" 7"])
    assert " 7" not in stopped and llm.last_stats.stop_reason == "stop"


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_batch_of_8_gives_each_request_its_greedy_output_alone(name):
    """Batch invariance on the default path (executor, llama.cpp numerics): eight prompts of
    mixed lengths decode together, continuous batching and chunked prefill included; each
    request's greedy tokens equal its tokens run alone."""
    from llcinfer import LLM

    llm = LLM(name, threads=2, n_ctx=512, n_seq=8, n_batch=64, progress=False)
    assert llm.executor_note is None
    ids = llm.tokenize(TEXT * 3)
    prompts = [ids[i:i + n] for i, n in zip(range(0, 80, 10), (5, 120, 33, 200, 9, 64, 17, 150))]
    params = dict(max_tokens=48, temperature=0, ignore_eos=True)
    batch = [h.result() for h in [llm.engine.submit(p, llm._params(params)) for p in prompts]]
    llm.reset()
    alone = []
    for p in prompts:
        llm.reset()  # no prefix shared with the batch's sequences: computed afresh
        alone.append(llm.engine.submit(p, llm._params(params)).result())
    assert [b.token_ids for b in batch] == [a.token_ids for a in alone]
    assert all(len(b.token_ids) == 48 for b in batch)
    llm.close()
