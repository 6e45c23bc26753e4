"""Which sparse layers own an indexer (sparse/layer_choice.py, engine/sparse_layers.py):
the greedy search against every choice where greedy is exact, the cache, the config
rules, and the search on a tiny model giving a config the engine runs."""

import itertools

import numpy as np
import pytest

from tiny_models import isolated_runtime, write_tiny_model
from llcinfer.errors import UsageError
from llcinfer.sparse import SparseConfig
from llcinfer.sparse.layer_choice import choice_file, greedy_full_layers, load_choice, save_choice


def additive_loss(cost):
    """Each shared layer adds its own cost: greedy drops the cheapest, which is optimal."""
    return lambda full: float(sum(c for layer, c in enumerate(cost) if layer not in full))


@pytest.mark.parametrize("seed", range(4))
def test_greedy_is_exact_on_an_additive_loss(seed):
    rng = np.random.default_rng(seed)
    S = 7
    cost = rng.uniform(0, 1, S)
    loss = additive_loss(cost)
    for n_full in range(1, S + 1):
        seen = []
        full, value = greedy_full_layers(S, n_full, loss, lambda n, v: seen.append(n))
        best = min((loss(frozenset((0, *rest))), [0, *rest]) for rest in itertools.combinations(range(1, S), n_full - 1))
        assert full == best[1] and value == pytest.approx(best[0])
        assert seen == list(range(S - 1, n_full - 1, -1))  # one drop at a time


def test_greedy_counts_and_interactions():
    """A layer that only pays together with its neighbour: the greedy search keeps the pair."""
    calls = []

    def loss(full):
        calls.append(full)
        return 1.0 * (3 not in full) + 1.0 * (4 not in full) - 1.5 * (3 not in full and 4 not in full) + 0.1 * len(full)

    full, _ = greedy_full_layers(6, 3, loss)
    assert full == [0, 3, 4]
    assert len(calls) == 1 + 5 + 4 + 3  # the start, then every candidate of each drop
    with pytest.raises(ValueError):
        greedy_full_layers(6, 0, loss)
    with pytest.raises(ValueError):
        greedy_full_layers(6, 7, loss)


def test_choice_cache_round_trip(tmp_path):
    path = choice_file(tmp_path / "m-keys-r16-v1.npz", SparseConfig(), 3)
    assert load_choice(path, 10, 3) is None
    save_choice(path, [0, 4, 7])
    assert load_choice(path, 10, 3) == [0, 4, 7]
    assert load_choice(path, 6, 3) is None and load_choice(path, 10, 2) is None  # another model or count
    path.write_text("0 7 4\n")
    assert load_choice(path, 10, 3) is None  # not ascending


def test_config_rules():
    cfg = SparseConfig(dense_layers=2, full_layers=(2, 5))
    assert cfg.layer_kinds(7) == ["dense", "dense", "full", "shared", "shared", "full", "shared"]
    assert cfg.n_full(7) == 2 and SparseConfig(indexers=3).n_full(7) == 3
    assert SparseConfig().n_full(7) == 7 - SparseConfig.dense_layers
    for bad in ({"full_layers": (3, 5)}, {"full_layers": (1, 2)}, {"full_layers": (2, 2)}, {"indexers": 0}):
        with pytest.raises(UsageError):
            SparseConfig(dense_layers=2, **bad)


def test_search_on_a_tiny_model_is_cached_and_runs(tmp_path_factory, monkeypatch):
    from llcinfer import LLM
    from llcinfer.engine import sparse_setup

    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        path = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny5.gguf", arch="qwen2", qtype="Q8_0", n_layer=6,
                                d_model=128, n_head=4, n_kv_head=2, d_ff=96)
        llm = LLM(str(path), threads=1, n_ctx=128)
        cfg = SparseConfig(top_k=16, sink=4, window=16, indexers=2)
        lines = []
        chosen = sparse_setup.with_chosen_layers(llm.model, llm.tokenizer, cfg, lines.append, n_tokens=200, probes=8)
        first = SparseConfig.dense_layers  # the first sparse layer always owns one
        assert len(chosen.full_layers) == 2 and chosen.full_layers[0] == first and chosen.n_full(6) == 2
        assert any("KL" in line for line in lines)
        assert chosen.layer_kinds(6).count("shared") == 6 - first - 2
        with monkeypatch.context() as m:  # the second time from the cache: no search
            m.setattr(sparse_setup, "choose_full_layers", None)
            assert sparse_setup.with_chosen_layers(llm.model, llm.tokenizer, cfg, print, 200, 8) == chosen
        assert sparse_setup.with_chosen_layers(llm.model, llm.tokenizer, SparseConfig(), print) == SparseConfig()
        llm.close()
        with pytest.raises(UsageError, match="sparse_indexers"):
            LLM(str(path), threads=1, sparse_indexers=2)
        llm = LLM(str(path), threads=1, n_ctx=128, sparse=True, sparse_indexers=2)  # the default search, cached
        assert llm.engine.sparse.kinds.count("full") == 2 and llm.kv_stats()["index_full_layers"] == 2
        assert llm.generate("hello the world", max_tokens=4, temperature=0)
        llm.close()
