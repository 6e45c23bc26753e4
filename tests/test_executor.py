"""The dependency-driven executor: equal to the batched forward pass, no deadlock or lost wake-up,
errors propagate and leave it usable."""

import numpy as np
import pytest

from llcinfer.dtypes import KV_F16
from llcinfer.engine.runner import ModelRunner
from llcinfer.executor import DecodeExecutor, Domains, ExecutorError, Tiles, WorkerPool, unsupported_reason
from task_graphs import Graph, barrier_ns, chain, handoff_ns
from llcinfer.executor.tiles import F_KIND, FAIL
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.engine.transformer import Transformer
from tiny_models import isolated_runtime, write_tiny_model


@pytest.fixture(scope="module", autouse=True)
def _runtime(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("exec_models")
    made = {}

    def get(qtype="Q8_0", **kw):
        key = (qtype, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = write_tiny_model(root / f"m{len(made)}.gguf", qtype=qtype, **kw)
        return made[key]

    return get


def _prefilled(model, prompts, n_ctx=96):
    pool, prefix = model.new_pool(n_ctx, len(prompts), prefix_sharing=False)
    from llcinfer.kv import PagedSequence

    seqs = [PagedSequence(pool, n_ctx, None, f"s{i}") for i in range(len(prompts))]
    for s, p in zip(seqs, prompts):
        model.forward(p, s)
    return seqs


DOMAINS = [Domains(weight=(None,)), Domains(weight=(None, None)), Domains(weight=(None,), attention=(None,)),
           Domains(weight=(None, None), attention=(None,), micro_batches=2, tiles=Tiles(16, 32, 16, 64))]


@pytest.mark.parametrize("qtype,arch", [("Q8_0", "llama"), ("Q4_1", "qwen2"), ("Q4_K", "llama"), ("Q6_K", "qwen2")])
@pytest.mark.parametrize("dom", range(len(DOMAINS)))
def test_executor_equals_simple_path(tiny, qtype, arch, dom):
    """The batched path's logits (to float rounding: fastmath may order the RMSNorm sums
    differently where it is inlined) and its greedy tokens, for 1 and 3 sequences."""
    path = tiny(qtype, arch=arch) if arch == "llama" else tiny(qtype, arch=arch)
    ref = Transformer(GGUFFile(path))
    fast = Transformer(GGUFFile(path))
    assert unsupported_reason(fast) is None
    ex = DecodeExecutor(fast, DOMAINS[dom])
    prompts = [[1, 5, 9], [2, 7, 11, 13, 17], [3]]
    for n_seq in (1, 3):
        ref_seqs, fast_seqs = _prefilled(ref, prompts[:n_seq]), _prefilled(fast, prompts[:n_seq])
        toks = [4] * n_seq
        for _ in range(5):
            want = np.stack([ref.forward([t], s) for t, s in zip(toks, ref_seqs)])
            got = ex.step(fast_seqs, toks)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
            assert np.argmax(got, axis=1).tolist() == np.argmax(want, axis=1).tolist()
            assert [s.n_tokens for s in fast_seqs] == [s.n_tokens for s in ref_seqs]
            toks = [int(np.argmax(r)) for r in want]
    ex.close()


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
@pytest.mark.parametrize("dom", range(len(DOMAINS)))
def test_step_rows_chain_equals_token_by_token(tiny, qtype, dom):
    """A drafted chain verified in one step (beside another sequence's plain row) gives
    the logits and K/V of decoding its tokens one step at a time, bit for bit."""
    m = Transformer(GGUFFile(tiny(qtype)))
    ex = DecodeExecutor(m, DOMAINS[dom])
    prompts = [[1, 5, 9, 2, 7], [3, 8, 6, 4, 4, 1, 2, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
    one, chain = [7], [11, 4, 250, 3, 9, 17]
    seqs = _prefilled(m, prompts)
    want = [ex.step(seqs, [one[0], chain[0]])]
    want += [ex.step(seqs[1:], [t]) for t in chain[1:]]
    want_kv = [[s.read(layer, 0, s.n_tokens) for layer in range(m.config.n_layer)] for s in seqs]
    for s, p in zip(seqs, prompts):
        s.truncate(len(p))
    got = ex.step_rows(seqs, [one, chain], [True, False])
    assert got.shape == (1 + len(chain), m.config.vocab_size)
    assert np.array_equal(got[0], want[0][0])
    assert np.array_equal(got[1:], np.stack([want[0][1]] + [w[0] for w in want[1:]]))
    assert [s.n_tokens for s in seqs] == [len(p) + n for p, n in zip(prompts, (1, len(chain)))]
    for s, kv in zip(seqs, want_kv):
        for layer in range(m.config.n_layer):
            for a, b in zip(s.read(layer, 0, s.n_tokens), kv[layer]):
                assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="appears twice"):
        ex.step_rows([seqs[0], seqs[0]], [[1], [2]])
    with pytest.raises(ValueError, match="none empty"):
        ex.step_rows(seqs, [[1], []])
    with pytest.raises(ValueError, match="out of range"):
        ex.step_rows(seqs, [[1], [2, -3]])
    ex.close()


def test_shortened_head_computes_the_first_logits_bit_for_bit(tiny):
    """``head_rows``: the logits of the first token ids only, equal to the full head's
    columns (a drafter's head); a count off the lanes is refused."""
    m = Transformer(GGUFFile(tiny("Q8_0")))
    full, short = DecodeExecutor(m, DOMAINS[1]), DecodeExecutor(m, DOMAINS[1], head_rows=128)
    seqs = _prefilled(m, [[1, 5, 9, 2, 7], [3, 8, 6]])
    want = full.step_rows(seqs, [[11, 4, 250], [7]])
    for s, n in zip(seqs, (5, 3)):
        s.truncate(n)
    got = short.step_rows(seqs, [[11, 4, 250], [7]])
    assert m.config.vocab_size > 128 and got.shape == (4, 128)
    assert np.array_equal(got, want[:, :128])
    with pytest.raises(ValueError, match="head_rows"):
        DecodeExecutor(m, DOMAINS[1], head_rows=100)
    full.close()
    short.close()


def test_executor_attention_splits_match_merge(tiny):
    """Long-context splits (partials + merge tasks) agree with one split to rounding, and a
    row merged beside a longer row (more slots than its own parts) gives the same bits."""
    path = tiny("Q8_0")
    m = Transformer(GGUFFile(path))
    ex = DecodeExecutor(m, Domains(weight=(None, None)))
    short, long = _prefilled(m, [list(range(1, 30)), list(range(1, 250))], n_ctx=300)
    forks = [long.fork("l2"), short.fork("s3"), long.fork("l3")]
    split = ex.step([long], [5])
    assert ex.last_program.n_splits == 4  # 250 keys, 2 workers, 2 kv heads
    ex.split_threads = 1  # one part per row
    one = ex.step([forks[0]], [5])
    assert ex.last_program.n_splits == 1
    np.testing.assert_allclose(split, one, rtol=1e-4, atol=1e-4)
    ex.split_threads = 2
    alone = ex.step([short], [5])
    beside = ex.step([forks[1], forks[2]], [5, 5])  # the short row's one part among 4 slots
    assert np.array_equal(beside[0], alone[0])
    ex.close()


def test_worker_failure_propagates_and_pool_stays_usable(tiny):
    path = tiny("Q8_0")
    m = Transformer(GGUFFile(path))
    ex = DecodeExecutor(m, Domains(weight=(None, None)))
    seqs = _prefilled(m, [[1, 2, 3]])
    good = ex.step(seqs, [4])
    prog = ex.program(1, 1)
    saved = prog.ops.copy()
    prog.ops[len(prog.ops) // 2, F_KIND] = FAIL  # a task in the middle raises
    with pytest.raises(ExecutorError, match="worker .* failed: RuntimeError: injected task failure"):
        ex.step(seqs, [4])
    prog.ops[:] = saved
    seqs[0].truncate(3)
    assert np.array_equal(ex.step(seqs, [4]), good)
    ex.close()


def test_bad_token_ids_are_refused_before_any_work(tiny):
    path = tiny("Q8_0")
    m = Transformer(GGUFFile(path))
    ex = DecodeExecutor(m, Domains(weight=(None, None)))
    seqs = _prefilled(m, [[1, 2, 3]])
    for bad, msg in (([-1], "out of range"), ([m.config.vocab_size], "out of range"), ([3.7], "must be integers"),
                     (["4"], "must be integers"), ([None], "must be integers"), ([4, 5], "2 tokens for 1")):
        with pytest.raises(ValueError, match=msg):
            ex.step(seqs, bad)
        assert seqs[0].n_tokens == 3  # nothing appended
    good = ex.step(seqs, [np.int64(4)])
    seqs[0].truncate(3)
    assert np.array_equal(ex.step(seqs, [4]), good)
    ex.close()


def test_serving_workers_follow_new_arguments_python_jobs_and_idle(tiny):
    """Workers 1.. stay in the numba serve loop between steps; they must leave it for a new
    argument tuple (another pool, grown block tables), a Python job in between, and after
    an idle spell (blocked on their Event), and still compute the reference's logits."""
    import time

    path = tiny("Q4_1", arch="qwen2")
    ref, fast = Transformer(GGUFFile(path)), Transformer(GGUFFile(path))
    ex = DecodeExecutor(fast, Domains(weight=(None, None, None)))
    ex.tables_capacity = 1  # tables grow (new arguments) at 2, 4 blocks
    counts = np.zeros(3, np.int64)

    def job(wid):
        counts[wid] += 1
        return 0

    for round_ in range(3):  # each round: a fresh pool (new arrays in the step's arguments)
        prompt = [1 + round_, 5, 9]
        r_seq, f_seq = _prefilled(ref, [prompt], n_ctx=160)[0], _prefilled(fast, [prompt], n_ctx=160)[0]
        tok = 4
        for i in range(40):  # crosses block boundaries (16 tokens): the tables grow
            want = ref.forward([tok], r_seq)
            got = ex.step([f_seq], [tok])[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
            if i % 7 == 3:
                ex.workers.run(job)
            if i % 13 == 5:
                time.sleep(0.02)  # past the serve loop's idle limit: the workers block
            tok = int(np.argmax(want))
    assert counts.tolist() == [18, 18, 18]
    ex.close()


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_random_graphs_no_deadlock(workers):
    """Random DAGs (oversubscribed too: up to 4 workers on 2 cores) give the sequential
    values; every run is bounded by the waits' timeout, so a deadlock fails, not hangs."""
    pool = WorkerPool([None] * workers)
    rng = np.random.default_rng(workers)
    for _ in range(30 if workers <= 2 else 8):
        g = Graph(int(rng.integers(1, 400)), workers, float(rng.uniform(0.0, 0.6)), rng, max_work=20)
        np.testing.assert_array_equal(g.run(pool), g.sequential_values())
    pool.close()


def test_many_short_jobs_no_lost_wakeup():
    """Thousands of back-to-back and spaced jobs: every worker runs every job once."""
    import time

    pool = WorkerPool([None, None, None])
    counts = np.zeros(3, np.int64)

    def job(wid):
        counts[wid] += 1
        return 0

    for i in range(3000):
        pool.run(job)
        if i % 500 == 0:
            time.sleep(0.01)  # let the workers fall back to blocking
    assert counts.tolist() == [3000, 3000, 3000]
    pool.close()


def test_sync_microbenchmark_runs():
    pool = WorkerPool([None, None])
    assert chain(10, 2).run(pool).tolist() == list(range(1, 11))
    assert handoff_ns(pool, n=500, reps=1) > 0 and barrier_ns(pool, rounds=500, reps=1) > 0
    pool.close()


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_real_model_greedy_same_on_executor(name):
    """24 greedy tokens of a real model: the executor (shared and split domains) gives the
    batched path's tokens."""
    from real_models import real_model_path

    model = Transformer(GGUFFile(real_model_path(name)))
    prompt = [1, 504, 3458, 1781, 2384, 359, 1411]

    def greedy(decode=None, n=24):
        cache = model.new_cache(64)
        logits, out = model.forward(prompt, cache), []
        for _ in range(n):
            out.append(int(np.argmax(logits)))
            logits = decode([cache], out[-1:])[0] if decode else model.forward([out[-1]], cache)
        return out

    want = greedy()
    for dom in (Domains(weight=(None, None)), Domains(weight=(None,), attention=(None,))):
        runner = ModelRunner(model, KV_F16, dom)
        assert runner.executor_note is None
        assert greedy(runner.decode) == want
        runner.close()


def test_llm_runs_the_plan_on_the_executor():
    from llcinfer import LLM

    llm = LLM("smollm2-135m", threads=2, n_ctx=256, progress=False)
    assert llm.executor_note is None and llm.engine.runner.executor is not None
    assert llm.plan is not None and llm.plan.kind in ("shared", "split")
    cores = set(llm.engine.runner.executor.domains.cores)
    assert cores == {c for d in llm.plan.domains for c in d.cores}
    text = llm.generate("The three primary colors are", max_tokens=12, temperature=0)
    assert len(text) > 0


def test_bad_pin_mode_is_a_usage_error():
    from llcinfer.errors import UsageError
    from llcinfer.executor.workers import placement

    with pytest.raises(UsageError, match="LLCINFER_PIN must be domain, core or none"):
        placement([0, 1], None, "bogus")
    assert placement([0, 1], [0, 1], "domain") == [{0}, {1}]
    assert placement([0, 1], None, "domain") == [{0, 1}, {0, 1}]
    assert placement([0, 1], None, "core") == [{0}, {1}]
    assert placement([0, 1], None, "none") == [None, None]
