"""Bad model files: GGUFFile, LLM and the command line.

Each case asserts the exception type from ``llcinfer.errors`` and that the message names
the problem; for the CLI, the exit code 1, exactly one ``error:`` line on stderr and no
traceback.  Bad arguments: test_usage_errors.py; seeded mutations: test_gguf_fuzz.py.
"""

import math
import struct
import time

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType as VT
from gguf.constants import GGMLQuantizationType as QT

from llcinfer.errors import ModelFileError, UnsupportedModelError
from llcinfer.model.gguf_file import GGUFFile
from llcinfer.engine.transformer import Transformer

from cli_run import assert_one_error_line, run_cli
from gguf_edit import GGUFMap
from tiny_models import isolated_runtime, random_weight, write_tiny_model

# Issue 28, "Model files that lie": each was accepted (or a traceback); now one error line.
LIES = {
    "freq_base_empty_u32_array": (lambda m: m.with_value("llama.rope.freq_base", VT.ARRAY, [], VT.UINT32),
                                  ["llama.rope.freq_base = []", "an array of UINT32", "FLOAT32/FLOAT64 scalar"]),
    "rms_eps_empty_u32_array": (lambda m: m.with_value("llama.attention.layer_norm_rms_epsilon", VT.ARRAY, [],
                                                       VT.UINT32),
                                ["llama.attention.layer_norm_rms_epsilon = []", "FLOAT32/FLOAT64 scalar"]),
    "offset_onto_another_tensor": (lambda m: m.with_tensor("blk.0.attn_k.weight",
                                                           offset=m.tensor_offset["blk.0.attn_q.weight"]),
                                   ["tensor blk.0.attn_k.weight", "overlaps tensor blk.0.attn_q.weight"]),
    "offset_off_alignment_by_3": (lambda m: m.with_tensor("blk.0.attn_k.weight",
                                                          offset=m.tensor_offset["blk.0.attn_k.weight"] + 3),
                                  ["tensor blk.0.attn_k.weight", "is not a multiple of 32", "general.alignment"]),
    "rms_eps_inf": (lambda m: m.with_value("llama.attention.layer_norm_rms_epsilon", VT.FLOAT32, math.inf),
                    ["llama.attention.layer_norm_rms_epsilon = inf", "finite epsilon in (0, 1)"]),
    "freq_base_minus_1": (lambda m: m.with_value("llama.rope.freq_base", VT.FLOAT32, -1.0),
                          ["llama.rope.freq_base = -1", "finite RoPE base in (1, 1e+12]"]),
    "freq_base_1e38": (lambda m: m.with_value("llama.rope.freq_base", VT.FLOAT32, 1e38),
                       ["llama.rope.freq_base = 1e+38", "finite RoPE base"]),
    "context_length_2_40": (lambda m: m.with_value("llama.context_length", VT.UINT64, 2**40),
                            ["llama.context_length = 1099511627776", "1 to 16777216 tokens"]),
}


@pytest.fixture(scope="module", autouse=True)
def _runtime(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        yield


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Named bad (and one good) model files, written once."""
    root = tmp_path_factory.mktemp("bad_gguf")
    good = write_tiny_model(root / "good.gguf", "llama", "Q8_0")
    data = good.read_bytes()
    paths = {"good": good, "root": root}

    (root / "dir.gguf").mkdir()
    paths["dir"] = root / "dir.gguf"
    paths["missing"] = root / "missing.gguf"
    (root / "empty.gguf").write_bytes(b"")
    paths["empty"] = root / "empty.gguf"
    (root / "random.gguf").write_bytes(np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes())
    paths["random"] = root / "random.gguf"
    (root / "text.gguf").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    paths["lfs_pointer"] = root / "text.gguf"

    # truncations at every part of the file
    reader = GGUFReader(good)
    m = GGUFMap(data)
    fields = list(reader.fields.values())
    tensors = reader.tensors
    last_end = max(int(t.data_offset) + int(t.n_bytes) for t in tensors)
    assert last_end == len(data)  # the last tensor ends the file: cutting 1 byte must be detected
    cuts = {
        "magic_only": 4,
        "in_header": 13,
        "header_only": 24,
        "in_first_kv": 30,
        "in_vocab": fields[-1].offset // 2,
        "in_last_kv": fields[-1].offset + 10,
        "at_tensor_info": tensors[0].field.offset,
        "in_tensor_info": tensors[len(tensors) // 2].field.offset + 5,
        "at_tensor_data": int(tensors[0].data_offset),
        "in_first_tensor": int(tensors[0].data_offset) + 100,
        "half": len(data) // 2,
        "last_byte": len(data) - 1,
    }
    for name, n in cuts.items():
        p = root / f"trunc_{name}.gguf"
        p.write_bytes(data[:n])
        paths["trunc_" + name] = p

    # corrupt fields
    def patched(name, offset, raw):
        buf = bytearray(data)
        buf[offset:offset + len(raw)] = raw
        p = root / f"corrupt_{name}.gguf"
        p.write_bytes(bytes(buf))
        paths["corrupt_" + name] = p

    t = tensors[3]
    type_off = t.field.offset + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape)
    patched("key_length", 24, b"\xff" * 8)
    patched("tensor_count", 8, struct.pack("<Q", 2**40))
    patched("kv_count", 16, struct.pack("<Q", 2**40))
    patched("version", 4, struct.pack("<I", 99))
    patched("tensor_type", type_off, struct.pack("<I", 1000))
    patched("tensor_offset", type_off + 4, struct.pack("<Q", 2**40))
    key = "tokenizer.ggml.token_type"  # [u64 key length][key][u32 ARRAY][u32 INT32][u64 length]
    patched("array_length", reader.fields[key].offset + 8 + len(key) + 8, struct.pack("<Q", 2**40 + 272))

    for name, (edit, _) in LIES.items():
        paths["lie_" + name] = root / f"lie_{name}.gguf"
        paths["lie_" + name].write_bytes(edit(m))
    edits = {  # the layout and metadata checks, one case each
        "duplicate_name": m.with_tensor("blk.0.attn_k.weight", new_name="blk.0.attn_q.weight"),
        "shape_too_small": m.with_tensor("blk.0.attn_k.weight", ne=[64, 16]),
        "past_the_end": m.with_tensor("output_norm.weight", offset=len(data)),
        "five_dims": m.with_tensor("blk.0.attn_k.weight", ne=[64, 32, 1, 1, 1]),
        "long_name": m.with_tensor("blk.0.attn_k.weight", new_name="blk.0." + "x" * 60),
        "tokens_not_strings": m.with_value("tokenizer.ggml.tokens", VT.ARRAY, [1, 2], VT.UINT32),
        "token_type_9": m.with_value("tokenizer.ggml.token_type", VT.ARRAY, [1] * 271 + [9], VT.INT32),
        "heads_per_layer_differ": m.with_value("llama.attention.head_count", VT.ARRAY, [4, 8], VT.UINT32),
        "heads_per_layer_short": m.with_value("llama.attention.head_count", VT.ARRAY, [4], VT.UINT32),
        "arch_not_a_string": m.with_value("general.architecture", VT.UINT32, 7),
    }
    for name, raw in edits.items():
        paths["edit_" + name] = root / f"edit_{name}.gguf"
        paths["edit_" + name].write_bytes(raw)

    # valid files that llcinfer must refuse
    paths["mamba"] = write_tiny_model(root / "mamba.gguf", "llama", "Q8_0",
                                      extra_metadata={"general.architecture": "mamba"})
    paths["q5_1"] = write_tiny_model(root / "q5_1.gguf", "llama", "Q8_0",
                                     tensor_type_override={"blk.1.ffn_up.weight": "Q5_1"})
    paths["q2_k_embd"] = write_tiny_model(root / "q2k.gguf", "qwen2", "Q4_K", embd_qtype="Q2_K")
    rng = np.random.default_rng(1)
    paths["bad_q_rows"] = write_tiny_model(  # d_model 64, 4 heads: attn_q must be [64, 64]
        root / "bad_q.gguf", "llama", "Q8_0", skip_tensors=["blk.0.attn_q.weight"],
        extra_tensors={"blk.0.attn_q.weight": (random_weight(rng, "Q8_0", 96, 64, 0.1), QT.Q8_0)})
    paths["bad_norm"] = write_tiny_model(
        root / "bad_norm.gguf", "llama", "Q8_0", skip_tensors=["blk.1.ffn_norm.weight"],
        extra_tensors={"blk.1.ffn_norm.weight": (np.ones(65, np.float32), None)})
    paths["missing_tensor"] = write_tiny_model(root / "no_down.gguf", "llama", "Q8_0",
                                               skip_tensors=["blk.1.ffn_down.weight"])
    paths["missing_bias"] = write_tiny_model(root / "no_bias.gguf", "qwen2", "Q8_0",
                                             skip_tensors=["blk.0.attn_k.bias"])
    paths["missing_key"] = write_tiny_model(root / "no_key.gguf", "llama", "Q8_0",
                                            extra_metadata={"llama.embedding_length": None})
    paths["bad_heads"] = write_tiny_model(root / "bad_heads.gguf", "llama", "Q8_0", n_head=4, n_kv_head=3)
    # 272 tokens in the vocabulary, 200 embedding rows: prompt ids can fall outside the model
    paths["small_embd"] = write_tiny_model(root / "small_embd.gguf", "llama", "Q8_0", vocab=200)
    return paths


# ---------------------------------------------------------------------------- GGUFFile
@pytest.mark.parametrize("name,fragment", [
    ("missing", "not found"),
    ("dir", "directory"),
    ("empty", "not a GGUF"),
    ("random", "not a GGUF"),
    ("lfs_pointer", "not a GGUF"),
])
def test_not_a_gguf_file(files, name, fragment):
    with pytest.raises(ModelFileError, match=fragment) as exc:
        GGUFFile(files[name])
    assert str(files[name]) in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("cut", [
    "magic_only", "in_header", "header_only", "in_first_kv", "in_vocab", "in_last_kv", "at_tensor_info",
    "in_tensor_info", "at_tensor_data", "in_first_tensor", "half", "last_byte",
])
def test_truncated_file(files, cut):
    with pytest.raises(ModelFileError, match="truncated or corrupt") as exc:
        GGUFFile(files["trunc_" + cut])
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 400


@pytest.mark.parametrize("field", ["key_length", "tensor_count", "kv_count", "version", "tensor_offset",
                                   "array_length"])
def test_corrupt_header_fields(files, field):
    t0 = time.perf_counter()
    with pytest.raises(ModelFileError, match="truncated or corrupt") as exc:
        GGUFFile(files["corrupt_" + field])
    assert time.perf_counter() - t0 < 2.0  # gguf alone loops once per remaining element on a bad array length
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 400
    if field == "array_length":  # refused by the length check, before gguf reads 2^40 elements
        assert f"{2**40 + 272} elements of INT32 need at least" in str(exc.value)


@pytest.mark.parametrize("name,fragments", [
    ("duplicate_name", ["tensor blk.0.attn_q.weight: duplicate name"]),
    ("shape_too_small", ["blk.0.attn_v.weight starts 1088 bytes after tensor blk.0.attn_k.weight ends"]),
    ("past_the_end", ["tensor output_norm.weight needs bytes up to"]),
    ("five_dims", ["5 dimensions (at most 4)"]),
    ("long_name", ["name of 66 bytes (GGML allows 63)"]),
    ("tokens_not_strings", ["tokenizer.ggml.tokens = [1, 2] (2 elements) (an array of UINT32): expected an array of STRING"]),
    ("token_type_9", ["tokenizer.ggml.token_type[271] = 9: expected token types 0 to 6"]),
    ("heads_per_layer_differ", ["llama.attention.head_count: per-layer values differ ([4, 8])"]),
    ("heads_per_layer_short", ["llama.attention.head_count = [4] (1 element): expected one value per layer (2 layers)"]),
    ("arch_not_a_string", ["general.architecture = 7 (UINT32): expected a STRING scalar"]),
])
def test_refused_layouts_and_metadata(files, name, fragments):
    with pytest.raises(ModelFileError) as exc:
        GGUFFile(files["edit_" + name])
    for frag in fragments:
        assert frag in str(exc.value), str(exc.value)
    assert "\n" not in str(exc.value)


def test_unknown_tensor_type_names_the_tensor(files):
    with pytest.raises(UnsupportedModelError, match="tensor blk.0.attn_k.weight: unknown tensor type 1000"):
        GGUFFile(files["corrupt_tensor_type"])


def test_good_file_loads(files):
    f = GGUFFile(files["good"])
    assert f.require("general.architecture") == "llama"
    assert f.tensor("blk.0.attn_q.weight").shape == (64, 64)
    assert f.tensor("output.weight", required=False) is None
    with pytest.raises(ModelFileError, match="tensor missing from GGUF: nope"):
        f.tensor("nope")
    with pytest.raises(ModelFileError, match="metadata key missing: nope"):
        f.require("nope")


# ---------------------------------------------------------------------------- Transformer / LLM
def _load(kind, path):
    if kind == "transformer":
        return Transformer(GGUFFile(path))
    from llcinfer import LLM

    return LLM(str(path), threads=1)


@pytest.mark.parametrize("kind", ["transformer", "llm"])
@pytest.mark.parametrize("name,exc_type,fragments", [
    ("mamba", UnsupportedModelError, ["mamba", "llama", "qwen2"]),
    ("q5_1", UnsupportedModelError, ["Q5_1", "blk.1.ffn_up.weight"]),
    ("q2_k_embd", UnsupportedModelError, ["Q2_K", "token_embd.weight"]),
    ("bad_q_rows", ModelFileError, ["blk.0.attn_q.weight", "(96, 64)", "(64, 64)"]),
    ("bad_norm", ModelFileError, ["blk.1.ffn_norm.weight", "65"]),
    ("missing_tensor", ModelFileError, ["blk.1.ffn_down.weight", "missing"]),
    ("missing_bias", ModelFileError, ["blk.0.attn_k.bias"]),
    ("missing_key", ModelFileError, ["llama.embedding_length"]),
    ("bad_heads", ModelFileError, ["head_count"]),
])
def test_refused_models(files, kind, name, exc_type, fragments):
    with pytest.raises(exc_type) as exc:
        _load(kind, files[name])
    msg = str(exc.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    assert "\n" not in msg


@pytest.mark.parametrize("name,fragment", [
    ("missing", "not found"), ("dir", "not a file"), ("random", "not a GGUF"), ("trunc_half", "truncated"),
])
def test_llm_bad_paths(files, name, fragment):
    from llcinfer import LLM

    with pytest.raises(ModelFileError, match=fragment):
        LLM(str(files[name]), threads=1)
    with pytest.raises(ModelFileError, match=fragment):
        LLM(files[name], threads=1)  # a PathLike too


def test_vocab_larger_than_embedding_is_refused(files):
    from llcinfer import LLM

    with pytest.raises(ModelFileError) as exc:
        LLM(str(files["small_embd"]), threads=1)
    assert "200" in str(exc.value) and "272" in str(exc.value)


def test_cli_vocab_larger_than_embedding(files):
    assert_one_error_line(run_cli("generate", "-m", files["small_embd"], "-n", "2", "hello the world"), 1, "200")


# ---------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("name,fragment", [
    ("missing", "not found"), ("dir", "not a file"), ("random", "not a GGUF"), ("trunc_in_vocab", "truncated or corrupt"),
    ("mamba", "mamba"), ("q5_1", "Q5_1"),
])
def test_cli_bad_model_file(files, name, fragment):
    proc = run_cli("generate", "-m", files[name], "-n", "2", "hi")
    assert_one_error_line(proc, 1, fragment)
    assert proc.stdout == ""


@pytest.mark.parametrize("name", list(LIES))
def test_cli_files_that_lie(files, name):
    """Issue 28's cases: ``llcinfer generate -m FILE -n 4 hi`` prints one error line, exit 1."""
    with pytest.raises(ModelFileError):
        GGUFFile(files["lie_" + name])
    proc = run_cli("generate", "-m", files["lie_" + name], "-n", "4", "hi")
    assert_one_error_line(proc, 1, *LIES[name][1])
    assert proc.stdout == ""
