"""The GGUF metadata llcinfer reads: every key, its GGUF type, whether it is required, its range.

``KEYS`` is that list.  ``Metadata`` (``GGUFFile.metadata``) checks a file's values against
it when the file is opened: a key of the wrong type (a scalar for an array, a string for a
number, ...) or out of its range is a ``ModelFileError`` naming the key, the value and what
was expected, so the code past this point (architectures, tokenizer, chat template, the
kernels) only sees values of the declared type and range.  Requiredness and defaults apply
where a key is read (``Metadata.value``); relations between keys (head counts that divide
the width, a vocabulary as long as the embedding) are the architecture's (``read_config``).

Kinds accept every GGUF type of their family: ``int`` any of UINT8 ... INT64, ``float``
FLOAT32 or FLOAT64, ``bool`` BOOL, ``str`` STRING.  Forms: ``scalar``; ``array`` (of the
kind); ``per_layer``: a scalar, or an array with one value per layer (``block_count``), all
equal (llcinfer runs uniform layers only).  ``{arch}`` in a name stands for the value of
``general.architecture``.  Keys not listed here are kept as parsed and never read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from gguf import GGUFValueType as VT

from ..errors import ModelFileError

KINDS = {
    "int": frozenset({VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64}),
    "float": frozenset({VT.FLOAT32, VT.FLOAT64}),
    "bool": frozenset({VT.BOOL}),
    "str": frozenset({VT.STRING}),
}
# The KV pool keeps per-block bookkeeping for (n_seq + 1) full contexts of the default n_ctx,
# which is the file's context_length: 2^24 tokens (16.7M; the longest published context is
# 10M) is 2M blocks of 16 tokens.  Past that a model has to be run with an explicit n_ctx.
MAX_CONTEXT = 1 << 24
MAX_ROPE_BASE = 1e12  # published models use 1e4 ... ~1e9
TOKEN_TYPES = range(0, 7)  # llama.cpp's token attributes: undefined, normal, unknown, control, user, unused, byte


@dataclass(frozen=True)
class Key:
    """One metadata key llcinfer reads (see the module docstring for kinds and forms)."""

    name: str
    kind: str
    form: str = "scalar"
    required: bool = False
    default: Any = None
    valid: Callable[[Any], bool] | None = None  # on the value, or on each element of an array
    expect: str = ""  # what ``valid`` accepts, for the message


def _positive(v) -> bool:
    return v >= 1


def _rms_eps(v) -> bool:
    return math.isfinite(v) and 0.0 < v < 1.0


def _rope_base(v) -> bool:
    return math.isfinite(v) and 1.0 < v <= MAX_ROPE_BASE


POSITIVE = "a positive integer"
KEYS: tuple[Key, ...] = (
    Key("general.architecture", "str", required=True),
    Key("{arch}.block_count", "int", required=True, valid=_positive, expect=POSITIVE),
    Key("{arch}.context_length", "int", default=2048, valid=lambda v: 1 <= v <= MAX_CONTEXT,
        expect=f"a context length of 1 to {MAX_CONTEXT} tokens"),
    Key("{arch}.embedding_length", "int", required=True, valid=_positive, expect=POSITIVE),
    Key("{arch}.feed_forward_length", "int", "per_layer", required=True, valid=_positive, expect=POSITIVE),
    Key("{arch}.attention.head_count", "int", "per_layer", required=True, valid=_positive, expect=POSITIVE),
    Key("{arch}.attention.head_count_kv", "int", "per_layer", valid=_positive, expect=POSITIVE),  # default: head_count
    Key("{arch}.attention.key_length", "int", valid=_positive, expect=POSITIVE),  # default: width / head_count
    Key("{arch}.attention.layer_norm_rms_epsilon", "float", default=1e-5, valid=_rms_eps,
        expect="a finite epsilon in (0, 1)"),
    Key("{arch}.rope.freq_base", "float", default=10000.0, valid=_rope_base,
        expect=f"a finite RoPE base in (1, {MAX_ROPE_BASE:g}]"),
    Key("{arch}.rope.dimension_count", "int", valid=_positive, expect=POSITIVE),  # default: key_length
    # The vocabulary: the tokenizer refuses a file without tokens, merges or model (TokenizerError),
    # and treats a special token id outside the vocabulary as unset, as llama.cpp does.
    Key("tokenizer.ggml.model", "str"),
    Key("tokenizer.ggml.pre", "str"),
    Key("tokenizer.ggml.tokens", "str", "array"),
    Key("tokenizer.ggml.token_type", "int", "array", valid=lambda v: v in TOKEN_TYPES,
        expect=f"token types {TOKEN_TYPES.start} to {TOKEN_TYPES.stop - 1}"),
    Key("tokenizer.ggml.merges", "str", "array"),
    *(Key(f"tokenizer.ggml.{name}_token_id", "int")
      for name in ("bos", "eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")),
    Key("tokenizer.ggml.add_bos_token", "bool"),
    Key("tokenizer.ggml.add_eos_token", "bool"),
    Key("tokenizer.chat_template", "str"),
)


def show(value) -> str:
    """A value for a one-line message: long arrays and strings cut short."""
    if isinstance(value, list):
        head = ", ".join(repr(v) for v in value[:4])
        return f"[{head}{', ...' if len(value) > 4 else ''}] ({len(value)} element{'' if len(value) == 1 else 's'})"
    text = format(value, ".7g") if isinstance(value, float) else repr(value)  # f32 values: 1e+38, not 9.99999968e+37
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(types: tuple) -> str:
    return f"an array of {types[1].name}" if types[0] == VT.ARRAY else types[0].name


def _expected_type(key: Key) -> str:
    names = "/".join(sorted(t.name for t in KINDS[key.kind]))
    return {"scalar": f"a {names} scalar", "array": f"an array of {names}",
            "per_layer": f"a {names} scalar or one per layer"}[key.form]


class Metadata:
    """A file's metadata values, each key of ``KEYS`` checked (type, range) on construction.

    ``values`` / ``types``: key -> decoded value / GGUF types ((T,) for a scalar, (ARRAY, T)
    for an array), as gguf_file parsed them; ``where`` names the file in messages.
    ``get`` reads it like a dict, for the tokenizer and the chat template.
    """

    def __init__(self, values: dict, types: dict, where: str):
        self.where = where
        self._values = dict(values)
        arch_key = KEYS[0]  # general.architecture: the other names depend on it
        self.arch = self._check(arch_key, arch_key.name, types) if arch_key.name in values else None
        self.specs = {k.name.format(arch=self.arch): k for k in KEYS}
        for name, key in self.specs.items():
            if name in values and key is not arch_key:
                self._values[name] = self._check(key, name, types)

    def _fail(self, name: str, shown: str, expected: str):
        raise ModelFileError(f"GGUF metadata {name} = {shown}: expected {expected} ({self.where})")

    def _check(self, key: Key, name: str, types: dict):
        value, vtypes = self._values[name], types[name]
        is_array = vtypes[0] == VT.ARRAY
        form_ok = {"scalar": not is_array, "array": is_array, "per_layer": True}[key.form]
        if not form_ok or vtypes[-1] not in KINDS[key.kind]:
            self._fail(name, f"{show(value)} ({_type_name(vtypes)})", _expected_type(key))
        items = value if is_array else [value]
        if key.valid is not None and not all(key.valid(v) for v in set(items)):  # each distinct value once
            i, v = next((i, v) for i, v in enumerate(items) if not key.valid(v))
            self._fail(f"{name}[{i}]" if is_array else name, show(v), key.expect)
        if key.form == "per_layer" and is_array:
            return self._per_layer(name, value)
        return value

    def _per_layer(self, name: str, value: list):
        n_layer = self.get(f"{self.arch}.block_count")
        if not value or (n_layer is not None and len(value) != n_layer):
            self._fail(name, show(value), f"one value per layer ({n_layer} layers)")
        if len(set(value)) != 1:
            raise ModelFileError(f"GGUF metadata {name}: per-layer values differ ({sorted(set(value))[:4]}), "
                                 f"not supported ({self.where})")
        return value[0]

    def value(self, name: str):
        """The checked value of a key of ``KEYS``: its default when absent, unless it is
        required (``require``).  A per-layer array reads as its one value."""
        key = self.specs[name]
        if name in self._values or key.required:
            return self.require(name)
        return key.default

    def require(self, name: str):
        """The value of any key; a ``ModelFileError`` naming it when the file lacks it."""
        if name not in self._values:
            raise ModelFileError(f"GGUF metadata key missing: {name} ({self.where})")
        return self._values[name]

    def get(self, name: str, default=None):
        return self._values.get(name, default)
