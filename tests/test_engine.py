"""The step loop (llcinfer.engine): continuous batching, chunked prefill, preemption by
recomputation, cancellation, per-request sampling, requests from other threads, and batch
invariance (a request's greedy output does not depend on what runs beside it)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from tiny_models import isolated_runtime, write_tiny_model

from llcinfer.engine.loop import Engine
from llcinfer.engine.reference import ReferenceModel
from llcinfer.engine.sampling import SamplingParams
from llcinfer.engine.transformer import Transformer
from llcinfer.errors import ContextLengthError, OutOfMemoryError, UsageError
from llcinfer.executor import Domains
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.model.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 250, n).tolist()


def _tiny(tmp_path_factory, arch: str, llama_rounding: bool):
    """(path, Transformer, Tokenizer) of a tiny Q8_0 model of ``arch``."""
    with isolated_runtime(tmp_path_factory.mktemp("home")):
        path = write_tiny_model(tmp_path_factory.mktemp("m") / f"{arch}.gguf", arch=arch, qtype="Q8_0",
                                d_model=128, n_head=4, n_kv_head=2, d_ff=96)
        gguf = GGUFFile(path)
        yield path, Transformer(gguf, llama_rounding=llama_rounding), Tokenizer.from_metadata(gguf.metadata)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama model, exact f32 numerics (every row on the batched forward pass)."""
    yield from _tiny(tmp_path_factory, "llama", False)


def _engine(tiny, **kw) -> Engine:
    _, model, tok = tiny
    kw.setdefault("n_ctx", 96)
    kw.setdefault("block_size", 4)
    return Engine(model, tok, **kw)


def _greedy_reference(path, prompt, n) -> list[int]:
    """n greedy tokens from the NumPy oracle (the whole sequence recomputed per token)."""
    ref = ReferenceModel(GGUFFile(path), llama_rounding=False)
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(ref.logits(ids)[-1])))
    return ids[len(prompt):]


def test_greedy_matches_the_reference(tiny):
    path = tiny[0]
    eng = _engine(tiny, step_tokens=8)
    prompt = _prompt(0, 21)  # 3 chunks of prefill
    got = eng.generate([prompt], GREEDY)[0]
    assert got.error is None and got.stop_reason == "length"
    assert got.token_ids == _greedy_reference(path, prompt, GREEDY.max_tokens)


def test_logprobs_are_the_models_log_softmax(tiny):
    """Each generated token's log-probability and top alternatives, against the oracle's
    logits; greedy, so the top alternative is the token itself."""
    path = tiny[0]
    eng = _engine(tiny)
    prompt = _prompt(3, 13)
    got = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=3))[0]
    ref = ReferenceModel(GGUFFile(path), llama_rounding=False)
    ids = prompt + got.token_ids
    assert len(got.logprobs) == len(got.top_logprobs) == 5
    for i, token in enumerate(got.token_ids):
        x = ref.logits(ids[: len(prompt) + i])[-1].astype(np.float64)
        log_p = x - x.max() - np.log(np.exp(x - x.max()).sum())
        assert got.logprobs[i] == pytest.approx(log_p[token], abs=2e-3)
        assert [t for t, _ in got.top_logprobs[i]] == np.argsort(-log_p)[:3].tolist()
        assert got.top_logprobs[i][0][0] == token
    assert got.mean_logprob == pytest.approx(sum(got.logprobs) / 5)
    plain = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert plain.logprobs is None and plain.token_ids == got.token_ids


def test_chunked_prefill_lets_the_others_decode(tiny):
    """A 60-token prompt arriving while another request decodes takes 8 steps of 8 tokens;
    the decoding request gets a token in every one of them."""
    eng = _engine(tiny, step_tokens=8, n_seq=2)
    short = eng.submit(_prompt(1, 5), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    eng.step()  # the short prompt's prefill: its first token
    long = eng.submit(_prompt(2, 60), GREEDY)
    steps = 0
    while long.request.n_computed < 60:
        before = short.request.stats.n_generated
        eng.step()
        steps += 1
        assert short.request.stats.n_generated == before + 1
    assert steps == 9  # 7 tokens a step beside the decode row: ceil(60 / 7)
    assert long.result().token_ids == eng.generate([_prompt(2, 60)], GREEDY)[0].token_ids


def test_continuous_batching_refills_a_finished_slot(tiny):
    eng = _engine(tiny, step_tokens=64, n_seq=2)
    lens = [2, 9, 5, 4]
    handles = [eng.submit(_prompt(10 + i, 6), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
               for i, n in enumerate(lens)]
    rows, run = [], eng.runner.run

    def counting(batch):
        rows.append(len(batch.chunks))
        return run(batch)

    eng.runner.run = counting
    eng.step()
    assert len(eng.scheduler.running) + len(eng.scheduler.waiting) == 4 and eng.scheduler.n_concurrent == 2
    while not all(h.done for h in handles):
        eng.step()
    # request 0 ends after 2 tokens, request 2 takes its place in the very next step, and so on
    assert max(rows) == 2 and rows[:8] == [2] * 8
    assert [len(h.result().token_ids) for h in handles] == lens
    solo = [eng.generate([_prompt(10 + i, 6)], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]
            for i, n in enumerate(lens)]
    assert [h.result().token_ids for h in handles] == [s.token_ids for s in solo]


def test_preemption_completes_everything(tiny):
    """Eight requests whose KV needs exceed the budget: some are preempted and recomputed,
    none is lost or fails, and each gives the tokens it gives alone."""
    prompts = [_prompt(20 + i, 10 + 3 * i) for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    free = _engine(tiny, n_seq=8, prefix_sharing=False)
    want = [c.token_ids for c in free.generate(prompts, params)]
    tight = _engine(tiny, n_seq=8, prefix_sharing=False)
    tight.pool.budget_blocks = 40  # 8 x ~10 blocks wanted at the end
    got = tight.generate(prompts, params)
    assert tight.scheduler.n_preemptions > 0
    assert [c.error for c in got] == [None] * 8 and [c.stop_reason for c in got] == ["length"] * 8
    assert [c.token_ids for c in got] == want
    assert sum(c.stats.n_preempted for c in got) == tight.scheduler.n_preemptions
    assert tight.pool.n_committed == 0


def test_a_request_that_never_fits_fails_alone(tiny):
    eng = _engine(tiny, n_seq=4, prefix_sharing=False)
    eng.pool.budget_blocks = 12  # 48 tokens
    res = eng.generate([_prompt(30, 6), _prompt(31, 50), _prompt(32, 5)],
                       SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert isinstance(res[1].error, OutOfMemoryError) and res[1].stop_reason == "error"
    assert "budget" in str(res[1].error)
    assert [len(res[0].token_ids), len(res[2].token_ids)] == [5, 5] and res[0].error is res[2].error is None
    # one that outgrows the budget while decoding, alone: fails once nothing is left to preempt
    res = eng.generate([_prompt(33, 30)], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    assert isinstance(res.error, OutOfMemoryError) and len(res.token_ids) >= 17
    assert eng.pool.n_committed == 0


def test_shared_system_prompt_is_computed_once(tiny):
    eng = _engine(tiny, n_seq=4)
    system = _prompt(40, 12)
    first = eng.generate([system + [40, 41, 42]], GREEDY)[0]
    rest = eng.generate([system + [40 + i, 41, 42] for i in (1, 2)], GREEDY)
    assert first.stats.n_prompt_evaluated == 15 and [r.stats.n_prompt_evaluated for r in rest] == [3, 3]
    assert eng.prefix.stats.hit_tokens == 24
    alone = _engine(tiny, prefix_sharing=False)
    for i, r in zip((1, 2), rest):
        assert alone.generate([system + [40 + i, 41, 42]], GREEDY)[0].token_ids == r.token_ids


def test_next_turn_starts_from_the_last_sequence(tiny):
    """A prompt that extends the last finished request (prompt + reply + new text, a chat
    turn) runs only its new tokens, partial blocks included; the same prompt again runs one."""
    eng = _engine(tiny, n_seq=2)
    p = _prompt(100, 10)
    first = eng.generate([p], GREEDY)[0]
    turn = p + first.token_ids + [7, 8, 9]  # the last reply token was never fed: 4 new tokens
    second = eng.generate([turn], GREEDY)[0]
    assert second.stats.n_prompt_evaluated == 4 and eng.scheduler.n_reused_tokens > 0
    again = eng.generate([turn], GREEDY)[0]
    assert again.stats.n_prompt_evaluated == 1 and again.token_ids == second.token_ids
    fresh = _engine(tiny, prefix_sharing=False).generate([turn], GREEDY)[0]
    assert fresh.stats.n_prompt_evaluated == len(turn) and fresh.token_ids == second.token_ids


def test_n_samples_share_the_prompt(tiny):
    """Four samples of one 40-token prompt: computed once (the others fork its blocks and
    take its logits), each sample its own seed, each as it would be alone."""
    eng = _engine(tiny, n_seq=4, step_tokens=16)
    p = _prompt(120, 40)
    hot = [SamplingParams(temperature=20.0, top_k=0, top_p=1.0, min_p=0.0, seed=s, max_tokens=8, ignore_eos=True)
           for s in range(4)]
    handles = eng.submit_n(p, hot)
    peak = []
    while not all(h.done for h in handles):
        eng.step()
        peak.append(eng.pool.n_committed)
    got = [h.result() for h in handles]
    assert [g.stats.n_prompt_evaluated for g in got] == [40, 0, 0, 0]
    assert max(peak) <= 10 + 4 * 2  # the prompt's 10 blocks once, a block or two more per sample
    assert eng.prefix.stats.hit_tokens >= 3 * 40
    alone = [_engine(tiny, prefix_sharing=False).generate([p], h)[0].token_ids for h in hot]
    assert [g.token_ids for g in got] == alone
    assert len({tuple(g.token_ids) for g in got}) > 1  # the seeds differ


def test_cancel_frees_the_blocks_at_once(tiny):
    eng = _engine(tiny, n_seq=2, prefix_sharing=False)
    h = eng.submit(_prompt(50, 30), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    other = eng.submit(_prompt(51, 7), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert eng.pool.n_committed > 0
    held = h.request.seq.n_blocks
    before = eng.pool.n_committed
    h.cancel()  # no step is running: freed now
    assert h.done and h.result().stop_reason == "cancelled"
    assert eng.pool.n_committed == before - held
    assert other.result().stop_reason == "length" and len(other.result().token_ids) == 4
    assert eng.pool.n_committed == 0


def test_a_failed_step_ends_its_requests_not_the_loop(tiny):
    eng = _engine(tiny, n_seq=2)
    run = eng.runner.run

    def broken(batch):
        raise RuntimeError("injected")

    eng.runner.run = broken
    h = eng.submit(_prompt(110, 6), GREEDY)
    done = h.result()
    assert done.stop_reason == "error" and "injected" in str(done.error)
    with pytest.raises(RuntimeError, match="injected"):
        list(eng.submit(_prompt(111, 6), GREEDY))
    eng.runner.run = run
    assert eng.generate([_prompt(110, 6)], GREEDY)[0].stop_reason == "length"


def test_per_request_sampling_and_seeds_are_their_own(tiny):
    eng = _engine(tiny, n_seq=4)
    p = _prompt(60, 8)
    hot = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7, max_tokens=10, ignore_eos=True)
    alone = eng.generate([p], hot)[0].token_ids
    batch = eng.generate([p, p, _prompt(61, 8)], hot)
    assert batch[0].token_ids == batch[1].token_ids == alone
    mixed = [eng.submit(p, hot), eng.submit(p, GREEDY)]
    assert mixed[0].result().token_ids == alone
    assert mixed[1].result().token_ids == eng.generate([p], GREEDY)[0].token_ids


def test_stop_strings_and_lengths_end_requests(tiny):
    _, _, tok = tiny
    eng = _engine(tiny, n_seq=2)
    p = _prompt(70, 6)
    full = eng.generate([p], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    stop = full.text[len(full.text) // 2:][:2]
    assert stop
    cut = eng.generate([p], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop]))[0]
    assert cut.stop_reason == "stop" and cut.text == full.text[:full.text.index(stop)]
    ctx = _engine(tiny, n_ctx=10).generate([p], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    assert ctx.stop_reason == "context" and len(ctx.token_ids) == 5  # 6 + 5 = 11: the last is never fed
    with pytest.raises(ContextLengthError):
        _engine(tiny, n_ctx=10).submit(_prompt(71, 11), GREEDY)
    with pytest.raises(UsageError):
        eng.submit([], GREEDY)
    with pytest.raises(UsageError):
        eng.submit([10_000], GREEDY)


def test_requests_from_many_threads_on_the_engine_thread(tiny):
    eng = _engine(tiny, n_seq=4)
    prompts = [_prompt(80 + i, 5 + i) for i in range(6)]
    want = [c.token_ids for c in eng.generate(prompts, GREEDY)]
    eng.start()
    got = [None] * len(prompts)

    def client(i):
        h = eng.submit(prompts[i], GREEDY)
        pieces = list(h)  # streams text while the engine thread steps
        got[i] = (h.result().token_ids, "".join(pieces) == h.result().text)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    eng.stop()
    assert got == [(w, True) for w in want]
    # a client that stops reading cancels its request
    h = eng.submit(prompts[0], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    for _ in h:
        break
    kept = eng.scheduler.retained.n_blocks if eng.scheduler.retained else 0
    assert h.done and h.result().stop_reason == "cancelled" and eng.pool.n_committed == len(eng.pool._cached) + kept


# ---------------------------------------------------------------------------- batch invariance
@pytest.fixture(scope="module")
def tiny_fast(tmp_path_factory):
    """A tiny qwen2 model in llama.cpp numerics: its decode rows run on the executor."""
    yield from _tiny(tmp_path_factory, "qwen2", True)


def test_batch_invariance_on_the_executor(tiny_fast):
    """Eight requests of mixed lengths (long enough for several attention splits) decode
    together on the executor: each gives exactly its tokens alone."""
    _, model, tok = tiny_fast
    eng = Engine(model, tok, n_ctx=512, step_tokens=32, n_seq=8, block_size=16, prefix_sharing=False,
                 domains=Domains(weight=(None, None)))
    assert eng.runner.executor is not None
    prompts = [_prompt(90 + i, n) for i, n in enumerate((3, 150, 17, 64, 200, 9, 33, 120))]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    batch = eng.generate(prompts, params)
    alone = [eng.generate([p], params)[0] for p in prompts]
    assert [b.token_ids for b in batch] == [a.token_ids for a in alone]
    eng.close()
