"""The fast forward pass against the NumPy reference, on tiny synthetic models.

Every architecture x every tensor type, in both numeric modes of the fast path:
exact float32 inputs (``llama_rounding=False``) against the float64 reference with a tight
bound, and llama.cpp-style input rounding (the default) against the reference doing the
same rounding.  Then incremental decoding against one-shot prefill; untied output, llama3
rope frequency factors, mixed tensor types, MHA/MQA layouts; and the ``LLM`` API (greedy
generation = argmax of the reference, tokenize/detokenize, logits, chat).
"""

import numpy as np
import pytest

from llcinfer.errors import ContextLengthError
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.engine.transformer import Transformer
from llcinfer.engine.reference import ReferenceModel
from llcinfer.engine.sampling import SamplingParams

from tiny_models import ALL_TYPES, EOS_ID, VOCAB_SIZE, isolated_runtime, write_tiny_model

# Exact mode, fast path (float32, fastmath) vs reference (float64, same dequantized weights):
# measured max |err| / max |ref| <= 1.3e-6 over all 18 models; ~15x headroom for other
# summation orders (SIMD kernels, thread counts).
REL_TOL = 2e-5
# llama.cpp rounding mode: both sides round matmul inputs to 8-bit blocks (and Q/K/V to f16),
# but an input within ~1e-7 of a rounding boundary can land on either side, which moves the
# logits by up to ~1.5e-2 x max |ref| (measured) from that position on.  Bound: 5e-2, and
# top-1 agreement at most positions instead of at every one.
ROUNDING_TOL = 5e-2
ARCHS = ("llama", "qwen2")
SEQ = np.array([3, 200, 17, 262, 45, 45, 99, 1, 150, 7, 271, 64, 33, 128, 0, 255, 80], np.int64)  # 17 ids
MODES = [pytest.param(False, id="exact"), pytest.param(True, id="llama_rounding")]


@pytest.fixture(scope="module", autouse=True)
def _runtime(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """models(arch, qtype, **kw) -> path of a tiny model, written once per module."""
    root = tmp_path_factory.mktemp("tiny_models")
    cache = {}

    def get(arch="llama", qtype="Q8_0", **kw):
        key = (arch, qtype, tuple(sorted((k, repr(v)) for k, v in kw.items())))
        if key not in cache:
            path = root / f"{arch}-{qtype}-{len(cache)}.gguf"
            cache[key] = write_tiny_model(path, arch=arch, qtype=qtype, **kw)
        return cache[key]

    return get


def fast_logits(path, ids, rounding=False) -> np.ndarray:
    tm = Transformer(GGUFFile(path), llama_rounding=rounding)
    cache = tm.new_cache(64)
    out = tm.forward(ids, cache, all_logits=True)
    assert cache.n_tokens == len(ids)
    return out


def ref_logits(path, ids, rounding=False) -> np.ndarray:
    return ReferenceModel(GGUFFile(path), llama_rounding=rounding).logits(ids)


def assert_logits_close(fast, ref, rounding=False):
    """Exact mode: |err| <= REL_TOL x max|ref| and the same top-1 wherever the reference's
    top-2 gap exceeds twice that.  Rounding mode: |err| <= ROUNDING_TOL x max|ref| and the
    same top-1 at >= 80% of the positions."""
    assert fast.shape == ref.shape and fast.dtype == np.float32
    assert np.all(np.isfinite(fast))
    rel = ROUNDING_TOL if rounding else REL_TOL
    scale = np.abs(ref).max()
    err = np.abs(fast - ref).max()
    assert err <= rel * scale, f"max |err| {err:.3g} > {rel} x max |ref| {scale:.3g}"
    if rounding:
        assert (fast.argmax(-1) == ref.argmax(-1)).mean() >= 0.8
        return
    top2 = np.sort(ref, axis=-1)[..., -2:]
    decided = (top2[..., 1] - top2[..., 0]) > 2 * rel * scale
    assert decided.mean() >= 0.8, "too many near-ties: the top-1 check is vacuous"
    np.testing.assert_array_equal(fast.argmax(-1)[decided], ref.argmax(-1)[decided])


@pytest.mark.parametrize("rounding", MODES)
@pytest.mark.parametrize("qtype", ALL_TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_reference(models, arch, qtype, rounding):
    path = models(arch, qtype)
    f = GGUFFile(path)
    assert all(t.qtype.name == qtype for n, t in f.tensors.items() if n.endswith(("_q.weight", "ffn_down.weight")))
    fast = fast_logits(path, SEQ, rounding)
    ref = ref_logits(path, SEQ, rounding)
    assert fast.shape == (len(SEQ), VOCAB_SIZE)
    assert_logits_close(fast, ref, rounding)


def test_default_mode_is_llama_rounding(models):
    """Transformer() and ReferenceModel() both default to llama.cpp's rounding."""
    path = models("llama", "Q4_0")
    tm = Transformer(GGUFFile(path))
    assert tm.llama_rounding is True and ReferenceModel(GGUFFile(path)).llama_rounding is True
    np.testing.assert_array_equal(tm.forward(SEQ, tm.new_cache(32), all_logits=True),
                                  fast_logits(path, SEQ, True))


@pytest.mark.parametrize("rounding", MODES)
@pytest.mark.parametrize("arch,qtype", [("llama", "Q4_0"), ("qwen2", "Q6_K"), ("llama", "BF16"), ("qwen2", "Q5_0"),
                                        ("qwen2", "F16")])
def test_incremental_decoding_equals_prefill(models, arch, qtype, rounding):
    """Rows are computed independently of the batch they are in: prefill, token-by-token and
    uneven chunks agree to float32 rounding (in both modes: the input rounding is per row)."""
    path = models(arch, qtype)
    tm = Transformer(GGUFFile(path), llama_rounding=rounding)
    full = tm.forward(SEQ, tm.new_cache(32), all_logits=True)
    scale = np.abs(full).max()

    # prefill 5, then one token at a time on the same cache
    cache = tm.new_cache(32)
    rows = [tm.forward(SEQ[:5], cache, all_logits=True)]
    for i in range(5, len(SEQ)):
        last = tm.forward(SEQ[i:i + 1], cache)  # last-token logits [vocab]
        assert last.shape == (VOCAB_SIZE,)
        rows.append(last[None])
        assert cache.n_tokens == i + 1
    np.testing.assert_allclose(np.concatenate(rows), full, rtol=0, atol=1e-6 * scale)

    # uneven chunks (the engine's batching); all_logits=False gives the last row
    cache = tm.new_cache(len(SEQ))
    got = []
    for a, b in ((0, 3), (3, 4), (4, 15), (15, 17)):
        got.append(tm.forward(list(SEQ[a:b]), cache, all_logits=True))
    np.testing.assert_allclose(np.concatenate(got), full, rtol=0, atol=1e-6 * scale)

    # rollback: truncate the cache and run the tail again
    cache.truncate(10)
    np.testing.assert_allclose(tm.forward(SEQ[10:], cache), full[-1], rtol=0, atol=1e-6 * scale)


@pytest.mark.parametrize("arch,qtype", [("llama", "Q8_0"), ("qwen2", "Q4_K"), ("llama", "F16")])
def test_untied_output(models, arch, qtype):
    path = models(arch, qtype, tied=False)
    f = GGUFFile(path)
    assert "output.weight" in f.tensors
    tm = Transformer(f)
    assert tm.weights.output is not tm.weights.token_embd
    assert_logits_close(fast_logits(path, SEQ), ref_logits(path, SEQ))
    assert_logits_close(fast_logits(path, SEQ, True), ref_logits(path, SEQ, True), rounding=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_rope_freq_factors(models, arch):
    path = models(arch, "Q8_0", rope_freqs=True)
    tm = Transformer(GGUFFile(path))
    assert tm.weights.rope_freq_factors is not None
    fast = fast_logits(path, SEQ)
    assert_logits_close(fast, ref_logits(path, SEQ))
    # same weights (rope_freqs is written last), no factors: different logits after position 0
    plain = fast_logits(models(arch, "Q8_0"), SEQ)
    np.testing.assert_allclose(plain[0], fast[0], rtol=0, atol=1e-6 * np.abs(fast).max())
    assert np.abs(plain[1:] - fast[1:]).max() > 1e-3 * np.abs(fast).max()


@pytest.mark.parametrize("rounding", MODES)
@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_tensor_types(models, arch, rounding):
    """A realistic mix: Q8_0 embedding, Q4_K / Q6_K layers, F16 and BF16 tensors, F16 norms."""
    override = {"blk.0.ffn_down.weight": "Q6_K", "blk.1.attn_v.weight": "Q6_K", "blk.1.attn_q.weight": "F16",
                "blk.0.ffn_up.weight": "BF16", "blk.1.ffn_norm.weight": "F16"}
    path = models(arch, "Q4_K", embd_qtype="Q8_0", tied=False, tensor_type_override=override)
    f = GGUFFile(path)
    assert f.tensors["token_embd.weight"].qtype.name == "Q8_0"
    assert f.tensors["blk.0.ffn_down.weight"].qtype.name == "Q6_K"
    assert f.tensors["blk.1.ffn_norm.weight"].qtype.name == "F16"
    assert_logits_close(fast_logits(path, SEQ, rounding), ref_logits(path, SEQ, rounding), rounding)


def test_gqa_and_mha_head_layouts(models):
    """n_kv_head = n_head (MHA) and n_kv_head = 1 (MQA), head_dim 32."""
    for n_head, n_kv in ((2, 2), (6, 1)):
        path = models("qwen2", "Q8_0", n_head=n_head, n_kv_head=n_kv, d_model=192, d_ff=64)
        tm = Transformer(GGUFFile(path))
        assert (tm.config.n_head, tm.config.n_kv_head, tm.config.head_dim) == (n_head, n_kv, 192 // n_head)
        assert_logits_close(fast_logits(path, SEQ), ref_logits(path, SEQ))


def test_forward_rejects_bad_input(models):
    tm = Transformer(GGUFFile(models("llama", "Q4_0")))
    cache = tm.new_cache(8)
    with pytest.raises(ValueError):
        tm.forward([], cache)
    for bad in ([VOCAB_SIZE], [-1], [5, VOCAB_SIZE + 100]):
        with pytest.raises(ValueError, match="out of range"):
            tm.forward(bad, cache)
    assert cache.n_tokens == 0
    tm.forward(SEQ[:6], cache)
    with pytest.raises(ContextLengthError):
        tm.forward(SEQ[6:9], cache)  # 6 + 3 > 8
    assert cache.n_tokens == 6  # the failed call left the cache as it was
    tm.forward(SEQ[6:8], cache)
    assert cache.n_tokens == 8


# ---------------------------------------------------------------------------- LLM API
@pytest.fixture(scope="module")
def llm_and_ref(models):
    """An LLM in exact mode (so greedy choices are comparable with the reference's argmax)."""
    from llcinfer import LLM

    path = models("qwen2", "Q8_0", seed=3)
    llm = LLM(str(path), threads=1, n_batch=5, numerics="f32")
    assert llm.model.llama_rounding is False
    return llm, ReferenceModel(GGUFFile(path), llama_rounding=False)


def test_llm_greedy_generation_matches_reference(llm_and_ref):
    llm, ref = llm_and_ref
    prompt = llm.tokenize("hello the world, in here")
    assert 5 < len(prompt) < 40
    done = llm.engine.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    got = done.token_ids
    assert len(got) == 8 and done.stop_reason == "length"
    seq = list(prompt)
    for step, tok in enumerate(got):
        logits = ref.logits(seq)[-1]
        top2 = np.sort(logits)[-2:]
        if top2[1] - top2[0] <= 2 * REL_TOL * np.abs(logits).max():
            break  # a near-tie: the greedy choice is not determined by the reference
        assert tok == int(np.argmax(logits)), f"step {step}"
        seq.append(tok)
    else:
        step = len(got)
    assert step >= 6, "too many near-ties for a meaningful comparison"
    # the text API produces the same tokens
    llm.reset()
    text = llm.generate("hello the world, in here", temperature=0, max_tokens=8, ignore_eos=True)
    assert text == llm.detokenize(got)


def test_llm_tokenize_roundtrip(llm_and_ref):
    llm, _ = llm_and_ref
    for text in ("hello the world", " the in", "héllo wörld ✓ 日本", "a\nb\tc  d", ""):
        ids = llm.tokenize(text)
        assert all(0 <= i < VOCAB_SIZE for i in ids)
        assert llm.detokenize(ids) == text
    ids = llm.tokenize(" the")
    assert [llm.tokenizer.token_text(i) for i in ids] == ["Ġthe"]
    special = llm.tokenize("<|im_start|>user", special=True)
    assert special[0] == 1 and llm.detokenize(special) == "user"
    assert llm.tokenize("<|im_start|>", special=False) != [1]


def test_llm_logits_equal_reference_last_row(llm_and_ref):
    llm, ref = llm_and_ref
    ids = [int(i) for i in np.random.default_rng(0).integers(0, VOCAB_SIZE, 23)]  # 5 batches of n_batch=5
    out = llm.logits(ids)
    want = ref.logits(ids)
    assert out.shape == (VOCAB_SIZE,) and out.dtype == np.float32
    assert_logits_close(out[None], want[-1:])
    # again on a prefix: no stale cache state
    assert_logits_close(llm.logits(ids[:4])[None], want[3:4])


def test_llm_chat_renders_and_runs(llm_and_ref):
    llm, _ = llm_and_ref
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    prompt = llm.apply_chat_template(messages)
    assert prompt == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
                      "<|im_start|>assistant\n")
    reply = llm.chat(messages, max_tokens=6, temperature=0)
    assert isinstance(reply, str)
    stats = llm.last_stats
    assert stats.stop_reason in ("length", "eos")
    assert stats.n_generated <= 6
    assert stats.n_generated == 6 or stats.stop_reason == "eos"
    streamed = "".join(llm.chat(messages, stream=True, max_tokens=6, temperature=0))
    assert streamed == reply
    # sampled generation runs too, and respects max_tokens
    llm.chat(messages, max_tokens=4, temperature=0.9, seed=1)
    assert llm.last_stats.n_generated <= 4


def test_llm_greedy_stops_at_eos(models):
    """Make EOS the greedy choice (its embedding row = the largest logit) and check the stop."""
    from llcinfer import LLM

    path = models("llama", "Q8_0", seed=5)
    llm = LLM(str(path), threads=1)
    prompt = llm.tokenize("hello")
    first = int(np.argmax(llm.logits(prompt)))
    llm.tokenizer.eog_ids = frozenset({first, EOS_ID})  # the first greedy token ends generation
    assert llm.generate("hello", temperature=0, max_tokens=5) == ""
    assert llm.last_stats.stop_reason == "eos" and llm.last_stats.n_generated == 0
    out = llm.generate("hello", temperature=0, max_tokens=3, ignore_eos=True)
    assert llm.last_stats.n_generated == 3 and llm.last_stats.stop_reason == "length"
    assert isinstance(out, str)
