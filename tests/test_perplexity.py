"""``llcinfer perplexity`` (llcinfer.bench.perplexity, kld_base): the NLL of every scored
position equals the NumPy oracle's, chunks split over many steps and run side by side,
cached blocks never skip a scored position; llama-perplexity's base-logits file encoded
and decoded within its quantization step; KL divergence and top-token agreement equal a
direct NumPy computation; bad input is one line; and, with a llama.cpp build, PPL and KLD
against llama-perplexity's own base file on a real model."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_run import assert_one_error_line, run_cli, run_main
from tiny_models import isolated_runtime, write_tiny_model

from llcinfer import LLM
from llcinfer.bench.kld_base import BaseWriter, decode_rows, encode_rows, read_base, row_width
from llcinfer.bench.perplexity import chunk_tokens, perplexity
from llcinfer.engine.reference import ReferenceModel
from llcinfer.engine.sampling import SamplingParams
from llcinfer.model.gguf_file import GGUFFile

CTX = 24  # 11 scored positions per chunk
STEP = 7  # tokens per engine step: every chunk spans several steps


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("home")):
        path = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf", arch="llama", qtype="Q8_0",
                                d_model=128, n_head=4, n_kv_head=2, d_ff=96, n_ctx=64)
        llm = LLM(str(path), threads=1, n_ctx=CTX, n_seq=2, n_batch=STEP, numerics="f32")
        yield path, llm
        llm.close()


def _tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 250, n)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def _oracle_rows(path, llm, tokens) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per chunk: the oracle's logits at the scored positions  # [11, vocab] and their targets."""
    ref = ReferenceModel(GGUFFile(path), llama_rounding=False)
    bos = llm.tokenizer.bos_id if llm.tokenizer.add_bos else None
    out = []
    for chunk in chunk_tokens(tokens, CTX, None, bos):
        logits = np.asarray(ref.logits(chunk))
        out.append((logits[CTX // 2:-1], np.asarray(chunk[CTX // 2 + 1:])))
    return out


def test_nll_of_every_scored_position_equals_the_oracle(tiny):
    path, llm = tiny
    tokens = _tokens(3 * CTX + 5)
    got = perplexity(llm, tokens, CTX)
    want = [-_log_softmax(rows)[np.arange(len(t)), t] for rows, t in _oracle_rows(path, llm, tokens)]
    assert len(got.chunks) == 3 and [len(c.nll) for c in got.chunks] == [CTX - 1 - CTX // 2] * 3
    for c, w in zip(got.chunks, want):
        np.testing.assert_allclose(c.nll, w, rtol=1e-4, atol=1e-4)
    assert got.ppl[0] == pytest.approx(math.exp(np.concatenate(want).mean()), rel=1e-4)
    assert got.running_ppl()[0] == pytest.approx(math.exp(want[0].mean()), rel=1e-4)
    # the same text again: its blocks are cached now, the scored positions still run
    hits = llm.kv_stats()["prefix_hit_tokens"]
    again = perplexity(llm, tokens, CTX, n_chunks=2)
    assert llm.kv_stats()["prefix_hit_tokens"] - hits >= 2 * 8  # the unscored halves came from the cache
    for a, b in zip(again.chunks, got.chunks):
        np.testing.assert_array_equal(a.nll, b.nll)


def test_base_rows_round_trip_within_a_quantization_step():
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 4, (9, 101)).astype(np.float32)
    logits[0] = 0.0  # a flat row: scale 0
    rows = encode_rows(logits)
    assert rows.shape == (9, row_width(101)) and row_width(101) == 2 * 51 + 4
    head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
    back = decode_rows(head, rows[:, 4:4 + 101])
    exact = _log_softmax(logits)
    above = logits >= logits.max(axis=1, keepdims=True) - 16  # below that llama.cpp clips
    step = head[:, :1]
    assert np.all(np.abs(back - exact)[above] <= (step / 2 + 1e-5).repeat(101, 1)[above])
    np.testing.assert_allclose(back[0], exact[0], atol=1e-6)


def test_kl_divergence_and_same_top_equal_numpy(tiny, tmp_path):
    path, llm = tiny
    tokens = _tokens(2 * CTX, seed=5)
    oracle = _oracle_rows(path, llm, tokens)
    noise = np.random.default_rng(9)
    base_file = tmp_path / "base.kld"
    writer = BaseWriter(base_file, CTX, llm.config.vocab_size, tokens)
    encoded = []
    for rows, _ in oracle:  # a base that really differs: the oracle's logits plus noise
        encoded.append(encode_rows(rows + noise.normal(0, 0.7, rows.shape).astype(np.float32)))
        writer.write_rows(encoded[-1])
    writer.close()
    base = read_base(base_file)
    assert (base.n_ctx, base.n_vocab, base.n_chunk) == (CTX, llm.config.vocab_size, 2)
    np.testing.assert_array_equal(base.tokens, tokens[:2 * CTX])
    got = perplexity(llm, None, CTX, base=base)
    for c, (rows, targets), enc in zip(got.chunks, oracle, encoded):
        base_lp = decode_rows(np.ascontiguousarray(enc[:, :4]).view(np.float32),
                              enc[:, 4:4 + llm.config.vocab_size]).astype(np.float64)
        ours = _log_softmax(rows)
        p_base = np.where(base_lp > -16, np.exp(base_lp), 0)
        np.testing.assert_allclose(c.kld, (p_base * (base_lp - ours)).sum(axis=1), rtol=1e-3, atol=1e-4)
        np.testing.assert_array_equal(c.same_top, rows.argmax(axis=1) == base_lp.argmax(axis=1))
        np.testing.assert_allclose(c.nll_base, -base_lp[np.arange(len(targets)), targets], rtol=1e-6)
    assert 0.01 < got.kld[0] < 5 and 0 < got.same_top < 1  # the noise moved the distributions


def _sampled_tokens(llm, n_seqs: int) -> list[int]:
    """Text the model itself writes (so its tokens are likely under it), CTX tokens a piece."""
    out = []
    for i in range(n_seqs):
        params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=CTX - 1,
                                ignore_eos=True, seed=i)
        out += [5 + i] + llm.engine.submit([5 + i], params).result().token_ids
    return out


def test_save_logits_writes_a_base_this_run_matches(tiny, tmp_path):
    path, llm = tiny
    tokens = _sampled_tokens(llm, 2)
    out = tmp_path / "ours.kld"
    first = perplexity(llm, tokens, CTX, save=str(out))
    assert out.stat().st_size == 20 + 4 * 2 * CTX + 2 * 2 * 11 * row_width(llm.config.vocab_size)
    again = perplexity(llm, None, CTX, base=read_base(out))
    assert again.ppl[0] == pytest.approx(first.ppl[0], rel=1e-12)
    nll, nll_base = np.concatenate([c.nll for c in again.chunks]), np.concatenate([c.nll_base for c in again.chunks])
    kept = nll < 15  # the file clips log p below max - 16
    assert kept.mean() > 0.8
    np.testing.assert_allclose(nll_base[kept], nll[kept], atol=2e-3)  # uint16 steps of at most 16 / 65535
    assert again.kld[0] < 1e-3 and again.same_top == 1.0


def test_cli_errors_are_one_line(tiny, tmp_path):
    path, llm = tiny
    model = str(path)
    assert_one_error_line(run_cli("perplexity", "-m", model), 2, "--file TEXT or --kl-divergence-base")
    short = tmp_path / "short.txt"
    short.write_text("a b c")
    assert_one_error_line(run_cli("perplexity", "-m", model, "-f", short, "-c", "16"), 2, "needs at least 32")
    assert_one_error_line(run_cli("perplexity", "-m", model, "-f", tmp_path / "none.txt"), 2, "cannot read")
    junk = tmp_path / "junk.kld"
    junk.write_bytes(b"not a logits file at all")
    assert_one_error_line(run_cli("perplexity", "-m", model, "--kl-divergence-base", junk), 2, "'_logits_'")
    cut = tmp_path / "cut.kld"
    writer = BaseWriter(cut, CTX, llm.config.vocab_size, _tokens(2 * CTX))
    writer.close()  # the header and tokens, no rows
    assert_one_error_line(run_cli("perplexity", "-m", model, "--kl-divergence-base", cut), 2, "truncated")
    other = tmp_path / "other.kld"
    writer = BaseWriter(other, CTX, 7, _tokens(2 * CTX))
    writer.write_rows(np.zeros((2 * 11, row_width(7)), np.uint16))
    writer.close()
    assert_one_error_line(run_cli("perplexity", "-m", model, "--kl-divergence-base", other), 2,
                          "vocabulary of 7 tokens")


def test_cli_sparse_is_announced_and_its_bad_options_are_one_line(tiny, tmp_path, capsys):
    """--sparse reaches the LLM and the first line says so; at -c 24 no row is sparse, so
    the estimate is the dense one."""
    path, _ = tiny
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 8)
    args = ("perplexity", "-m", path, "-f", text, "-c", CTX, "-t", "1", "--numerics", "f32", "--chunks", "2")
    (rc_d, out_d, err_d), (rc_s, out_s, err_s) = run_main(capsys, *args), run_main(capsys, *args, "--sparse",
                                                                               "--sparse-top-k", "32")
    assert rc_d == 0 and rc_s == 0, err_s
    assert "sparse" not in err_d
    first = re.search(r", sparse attention top-k 32 \((rows with >= (\d+) keys; no scored row has that many at -c "
                      rf"{CTX}|predicted never to pay on this machine: every row dense)\)", err_s.splitlines()[0])
    assert err_s.startswith("perplexity: ") and first, err_s  # the planner's threshold, beyond -c
    assert first.group(2) is None or int(first.group(2)) > CTX
    estimate = [next(ln for ln in out.splitlines() if ln.startswith("Final")).split("(")[0] for out in (out_d, out_s)]
    assert estimate[0] == estimate[1]
    for bad, why in ((("--sparse", "--sparse-top-k", "0"), "--sparse-top-k must be >= 1"),
                     (("--sparse-top-k", "5"), "--sparse-top-k needs --sparse")):
        rc, out, err = run_main(capsys, *args, *bad)
        assert rc == 2 and err == f"error: {why}" + (" (got 0)" if "0" in bad else "") + "\n", err


def _stdlib_text(n_files: int = 3) -> str:
    import os

    root = Path(os.__file__).parent
    return "\n".join((root / name).read_text() for name in ("os.py", "argparse.py", "inspect.py")[:n_files])


@pytest.mark.llamacpp
def test_against_llama_perplexity_on_smollm2(tmp_path):
    """llama-perplexity writes its base from the same text; ours scores against it."""
    from real_models import real_model_path

    from llcinfer.bench import llama_cpp as lc

    exe = next((lc.binary(c, "llama-perplexity") for c in lc.available_configs()
                if lc.binary(c, "llama-perplexity")), None)
    if exe is None:
        pytest.skip("no llama.cpp build with llama-perplexity (python perf/llama_cpp.py build --force)")
    text = tmp_path / "stdlib.txt"
    text.write_text(_stdlib_text())
    model, base = real_model_path("smollm2-135m"), tmp_path / "llama.kld"
    proc = subprocess.run([str(exe), "-m", model, "-f", str(text), "-c", "256", "--chunks", "6", "-t", "2",
                           "--kl-divergence-base", str(base)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = float(proc.stderr.split("Final estimate: PPL = ")[1].split()[0])
    llm = LLM("smollm2-135m", threads=2, n_ctx=256, n_seq=2, progress=False)
    try:
        got = perplexity(llm, None, 256, base=read_base(base))
    finally:
        llm.close()
    assert got.ppl[0] == pytest.approx(theirs, rel=0.01)
    assert got.ppl_base[0] == pytest.approx(theirs, rel=0.002)
    assert got.kld[0] < 0.01 and got.same_top > 0.95
