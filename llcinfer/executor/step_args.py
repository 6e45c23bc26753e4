"""The decode step's one declared interface: the arguments of ``run_worker(wid, *args)``, in
order.  DecodeExecutor builds the tuple by name from this list (``pack``) and
step_kernel.py checks, when it is imported, that run_worker takes exactly these
parameters; a field added on one side only fails at import, not as a silent shift."""

from __future__ import annotations

import inspect

STEP_FIELDS = (
    # program (program.py)
    ("ops", "[n_ops, N_FIELDS + EXTRA_FIELDS] int64 operator table"),
    ("order", "[workers, max_ops] int64 operator ids per worker, -1 padded"),
    ("counters", "[n_counters * COUNTER_STRIDE] int64 dependency counters"),
    # weights
    ("mats", "[n_mats, 5] int64 packed matrices: address, groups, stride, GGML type, activation kind"),
    ("tag", "the ISA path's vector tag (simd.make_tag)"),
    # activations of the step's M rows
    ("x", "[M, d_model] f32 residual stream"),
    ("hpriv", "[workers, M * K] f32 each worker's normed input"),
    ("qpriv", "[workers, 2, M * K] int8 each worker's quantized input, per activation kind"),
    ("dpriv", "[workers, 2, M * K / 32 + 1] f32 its block scales"),
    ("spriv", "[workers, 2, M * K / 16 + 1] int32 its block sums (kind 1, Q8_K, read as int16)"),
    ("qb", "[M, H * D] f32 queries"),
    ("kb", "[M, KVH * D] f32 keys"),
    ("vb", "[M, KVH * D] f32 values"),
    ("attn", "[M, H, D] f32 attention output"),
    ("gate", "[M, d_ff] f32"),
    ("up", "[M, d_ff] f32"),
    ("act", "[M, d_ff] f32 silu(gate) * up"),
    ("ytmp", "[M, d_model] f32 Wo / W_down tile outputs before the residual add"),
    ("logits", "[M, head_rows] f32 (the first head_rows token ids: DecodeExecutor)"),
    # norms and biases
    ("attn_norm", "[L, d_model] f32"),
    ("ffn_norm", "[L, d_model] f32"),
    ("out_norm", "[d_model] f32"),
    ("eps", "f32 RMSNorm epsilon"),
    ("bq", "[L, H * D] f32 (zeros without biases)"),
    ("bk", "[L, KVH * D] f32"),
    ("bv", "[L, KVH * D] f32"),
    ("has_bias", "bool"),
    # rows: positions, rope, sequences
    ("rope_cs", "[M, D / 2, 2] f32 each row's rope cos / sin"),
    ("neox", "bool: rotate halves (NEOX) instead of pairs"),
    ("round_q", "bool: Q rounded to f16 before attention (llama.cpp)"),
    ("lut", "[65536] f32 f16 -> f32 table"),
    ("pos", "[M] int64 each row's position"),
    ("seq", "[M] int64 row -> its block table (row of tables)"),
    ("tables", "[M, blocks] int32 pool block ids of each row's sequence"),
    ("split_threads", "workers a row's attention is split for: split_count(its keys, bs, KVH, this)"),
    # the paged KV pool (KVPool.kernel_args)
    ("pool", "[block, elems] the pool's data"),
    ("pool_f32", "[block, f32 words] the same bytes as f32 (int8 scales)"),
    ("kv_kind", "dtypes.KV_F32 | KV_F16 | KV_INT8"),
    ("kv_group", "int8 values per scale"),
    ("kv_scale_off", "f32 offset of a block's int8 scales"),
    ("bs", "tokens per block"),
    ("scale", "f32 1 / sqrt(head_dim)"),
    # attention partials
    ("pmax", "[M * KVH * S, G] f32 partial softmax max"),
    ("psum", "[M * KVH * S, G] f32 partial softmax sum"),
    ("pacc", "[M * KVH * S, G, D] f32 partial outputs"),
    # sparse attention (sparse/attention.py; one-element placeholders without it)
    ("sp_idx", "[full layer, pool block, KVH, r/4, token, 4] uint8 index keys (sparse/index_cache.py)"),
    ("sp_isc", "[full layer, pool block, KVH, token] f32 their scales"),
    ("sp_basis", "[L, KVH, r, D] f32 index-key basis"),
    ("sp_hbasis", "[L, H, r, D] f32 each query head's KV head basis"),
    ("sp_w", "[H] f32 head weights"),
    ("sp_slot", "[L] int64 each layer's full-layer slot, -1: it writes no index keys"),
    ("sp_conf", "[SP_FIELDS] int64 the selection rule (kernels/sparse_index.row_selection)"),
    ("sel_tables", "[M, blocks] int32 each row's gathered block table (TOPK)"),
    ("sel_n", "[M] int64 keys of each row's gathered table"),
    ("sp_scores", "[M, pool blocks] f32 each row's candidate block scores (SELECT)"),
    ("sp_anchor", "[M, full layer, 2] int64 each row's anchor: keys, blocks chosen (kernels/sparse_reuse.py)"),
    ("sp_chosen", "[M, full layer, blocks] int32 the candidate indices its anchor chose"),
    ("sp_anchor_q", "[M, full layer, H, D] f32 its anchor's query"),
    ("sp_counts", "[workers, L, COUNT_FIELDS] int64 sparse rows, keys attended, keys total, selections, reused"),
    ("prof", "[workers, n_ops + 1, 2] int64 cycles waiting / working per operator (shape[0] 0: off)"),
)
NAMES = tuple(name for name, _ in STEP_FIELDS)


def pack(values: dict) -> tuple:
    """The argument tuple of ``run_worker`` (after ``wid``) from a dict of every field."""
    missing = [n for n in NAMES if n not in values]
    extra = sorted(set(values) - set(NAMES))
    if missing or extra:
        raise ValueError(f"decode step arguments: missing {missing}, unknown {extra}")
    return tuple(values[n] for n in NAMES)


def check_signature(fn) -> None:
    """Raise if ``fn(wid, ...)``'s parameters are not ``wid`` and then exactly NAMES."""
    params = tuple(inspect.signature(fn).parameters)
    if params != ("wid",) + NAMES:
        raise TypeError(f"{fn.__name__}'s parameters differ from step_args.STEP_FIELDS: {params}")
