"""Seeded mutations of a GGUF file, for the fuzz suite (test_gguf_fuzz.py).

Not a test module.  ``mutate(rng, m)`` picks one of ``KINDS`` and returns (kind, what it
did, the mutated bytes) for the file mapped by ``m`` (gguf_edit.GGUFMap).  The kinds:

* byte-level: ``truncate``, random bit flips in the fixed header, the metadata, the tensor
  infos or the tensor data, and ``kv_lengths`` (a key / string / array length or a value
  type of one entry overwritten with a boundary value);
* structured: a metadata key given a value of another GGUF type (``kv_type``) or a boundary
  or out-of-range value of its own type (``kv_value``), dropped (``kv_delete``) or doubled
  (``kv_duplicate``); a chat template that fails to compile or render (``chat_template``);
  a tensor's offset, shape, type or name changed (``tensor_*``), two tensors' offsets
  swapped; the tensor or metadata count changed (``counts``).
"""

from __future__ import annotations

import math
import random
import struct

from gguf import GGUFValueType as VT
from gguf.constants import GGMLQuantizationType as QT

from llcinfer.model.metadata import KEYS

from gguf_edit import GGUFMap

INTS = [0, 1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 63, 64, 65, 96, 255, 256, 272, 2**16, 2**24, 2**24 + 1,
        2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**64 - 1]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-45, 1e-38, 1e-12, 1e-6, 1e-5, 0.999, 10000.0, 1e12, 1.1e12,
          1e38, 3.4e38, math.inf, -math.inf, math.nan]
BAD_UTF8 = b"\xff\xfe\xc3"
STRINGS = ["", "x", "llama", "qwen2", "mamba", "gpt2", "bert", "default", "smollm", "no-such-pre", BAD_UTF8,
           "é" * 3000]
TEMPLATES = ["{% if %}", "{{ raise_exception('boom') }}", "{{ messages[5]['content'] }}", "{{ 1 / 0 }}",
             "{% for i in range(10**9) %}x{% endfor %}", "{{ messages | tojson }}", "{{ undefined_var.x }}",
             "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "{{ messages.append(1) }}", "{{ '%d' % 'a' }}"]
SIZES = {VT.UINT8: (0, 2**8), VT.INT8: (-2**7, 2**7), VT.UINT16: (0, 2**16), VT.INT16: (-2**15, 2**15),
         VT.UINT32: (0, 2**32), VT.INT32: (-2**31, 2**31), VT.UINT64: (0, 2**64), VT.INT64: (-2**63, 2**63)}
SCALARS = [t for t in VT if t != VT.ARRAY]


def _int_type(v: int) -> VT:
    return next(t for t in (VT.UINT32, VT.INT32, VT.UINT64, VT.INT64) if SIZES[t][0] <= v < SIZES[t][1])


def _random_value(rng: random.Random, vtype: VT):
    """A value of GGUF type ``vtype``: a boundary value most of the time."""
    if vtype in SIZES:
        lo, hi = SIZES[vtype]
        return rng.choice([v for v in INTS + [-1, -2**31] if lo <= v < hi] + [rng.randrange(lo, hi)])
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        return rng.choice([f for f in FLOATS if vtype == VT.FLOAT64 or not abs(f) > 3.4e38])
    if vtype == VT.BOOL:
        return rng.random() < 0.5
    return rng.choice(STRINGS + TEMPLATES)


def _value_of_any_type(rng: random.Random):
    """(type, value, element type) of a random GGUF type, arrays (maybe empty) included."""
    if rng.random() < 0.35:
        sub = rng.choice(SCALARS)
        return VT.ARRAY, [_random_value(rng, sub) for _ in range(rng.choice([0, 0, 1, 2, 3]))], sub
    vtype = rng.choice(SCALARS)
    return vtype, _random_value(rng, vtype), None


def _own_type_value(rng: random.Random, m: GGUFMap, key: str):
    """(type, value, element type): a boundary value of the type ``key`` has in the file."""
    types = m.kv_types[key]
    if types[0] != VT.ARRAY:
        if types[0] in SIZES and rng.random() < 0.3:  # any width, so 2^40 and negatives fit
            value = rng.choice(INTS + [-1])
            return _int_type(value), value, None
        return types[0], _random_value(rng, types[0]), None
    sub = types[1]  # the seeds' arrays are not empty: the reader lists their element type
    items = list(m.values[key])
    edit = rng.choice(["drop_last", "empty", "dup", "replace", "append"])
    if edit == "drop_last" and items:
        items.pop()
    elif edit == "empty":
        items = []
    elif edit == "dup" and len(items) > 1:
        items[rng.randrange(len(items))] = items[rng.randrange(len(items))]
    elif edit == "replace" and items:
        items[rng.randrange(len(items))] = _random_value(rng, sub)
    else:
        items.append(_random_value(rng, sub))
    return VT.ARRAY, items, sub


def read_keys(m: GGUFMap) -> list[str]:
    """The keys of the file that llcinfer reads (model/metadata.py's KEYS)."""
    arch = m.values.get("general.architecture")
    return [k.name.format(arch=arch) for k in KEYS if k.name.format(arch=arch) in m.kv]


# ------------------------------------------------------------------------ the kinds
def truncate(rng, m):
    n = rng.randrange(m.data_start) if rng.random() < 0.6 else rng.randrange(len(m.data))
    return f"cut at {n}", m.data[:n]


def _flip(rng, m, lo, hi, what):
    buf = bytearray(m.data)
    spots = [rng.randrange(lo, hi) for _ in range(rng.choice([1, 1, 2, 4]))]
    for i in spots:
        buf[i] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
    return f"{what} bytes {spots}", bytes(buf)


def flip_header(rng, m):
    return _flip(rng, m, 0, 24, "header")


def flip_metadata(rng, m):
    return _flip(rng, m, m.kv_start, m.infos_start, "metadata")


def flip_tensor_info(rng, m):
    return _flip(rng, m, m.infos_start, m.infos_end, "tensor info")


def flip_data(rng, m):
    return _flip(rng, m, m.data_start, len(m.data), "data")


def kv_lengths(rng, m):
    """A length or type field of one metadata entry overwritten with a boundary value."""
    key = rng.choice(list(m.kv))
    start = m.kv[key].start
    vpos = start + 8 + len(key.encode())  # the value type
    fields = [("key length", start, "<Q"), ("value type", vpos, "<I")]
    if m.kv_types[key][0] == VT.STRING:
        fields.append(("string length", vpos + 4, "<Q"))
    if m.kv_types[key][0] == VT.ARRAY:
        fields += [("element type", vpos + 4, "<I"), ("array length", vpos + 8, "<Q")]
    name, at, fmt = rng.choice(fields)
    (old,) = struct.unpack_from(fmt, m.data, at)
    cap = 2**32 if fmt == "<I" else 2**64
    value = rng.choice([v for v in INTS + [old + 1, old - 1, old * 2] if 0 <= v < cap])
    buf = bytearray(m.data)
    struct.pack_into(fmt, buf, at, value)
    return f"{key}: {name} {old} -> {value}", bytes(buf)


def kv_type(rng, m):
    key = rng.choice(read_keys(m))
    vtype, value, sub = _value_of_any_type(rng)
    return f"{key} = {vtype.name}{'/' + sub.name if sub else ''} {str(value)[:40]}", m.with_value(key, vtype, value, sub)


def kv_value(rng, m):
    key = rng.choice(read_keys(m))
    vtype, value, sub = _own_type_value(rng, m, key)
    return f"{key} = {vtype.name} {str(value)[:40]}", m.with_value(key, vtype, value, sub)


def kv_delete(rng, m):
    key = rng.choice(list(m.kv))
    return f"without {key}", m.without(key)


def kv_duplicate(rng, m):
    span = m.kv[rng.choice(list(m.kv))]
    return f"entry at {span.start} twice", m.splice(span.end, span.end, m.data[span.start:span.end], kv_delta=1)


def chat_template(rng, m):
    """The chat template replaced by one that fails to compile or render, or cut short."""
    current = m.values["tokenizer.chat_template"]
    source = rng.choice(TEMPLATES + [current[:rng.randrange(len(current) + 1)]] * 4)
    return f"template {source[:40]!r}", m.with_value("tokenizer.chat_template", VT.STRING, source)


def tensor_offset(rng, m):
    name = rng.choice(list(m.tensors))
    old = m.tensor_offset[name]
    other = m.tensor_offset[rng.choice(list(m.tensors))]
    new = rng.choice([other, old + rng.randrange(1, m.alignment), old - m.alignment, old + m.alignment,
                      len(m.data), 2**40, 2**63, 0, other + rng.randrange(-3, 4)])
    return f"{name} offset {old} -> {new}", m.with_tensor(name, offset=max(0, new))


def tensor_shape(rng, m):
    name = rng.choice(list(m.tensors))
    ne = list(m.tensor_ne[name])
    edit = rng.choice(["scale", "value", "add_dim", "drop_dim", "many_dims"])
    if edit == "scale":
        i = rng.randrange(len(ne))
        ne[i] = max(0, int(ne[i] * rng.choice([2, 0.5, 1.5])))
    elif edit == "value":
        ne[rng.randrange(len(ne))] = rng.choice(INTS)
    elif edit == "add_dim":
        ne.append(rng.choice([1, 2]))
    elif edit == "drop_dim" and len(ne) > 1:
        ne.pop()
    else:
        ne = ne + [1] * rng.randrange(3, 6)
    return f"{name} ne {m.tensor_ne[name]} -> {ne}", m.with_tensor(name, ne=ne)


def tensor_type(rng, m):
    name = rng.choice(list(m.tensors))
    code = rng.choice([int(q) for q in QT] + [4, 5, 40, 1000, 2**31, 2**32 - 1])
    return f"{name} type {m.tensor_type[name]} -> {code}", m.with_tensor(name, type_code=code)


def tensor_name(rng, m):
    name = rng.choice(list(m.tensors))
    new = rng.choice([rng.choice(list(m.tensors)), name + "x", "", name.replace("0", "9"), BAD_UTF8])
    return f"{name} renamed {new!r}", m.with_tensor(name, new_name=new)


def tensor_swap(rng, m):
    a = rng.choice(list(m.tensors))
    same = [n for n in m.tensors if n != a and m.n_bytes(n) == m.n_bytes(a)]  # swaps that still fit, mostly
    b = rng.choice(same) if same and rng.random() < 0.7 else rng.choice([n for n in m.tensors if n != a])
    buf = bytearray(m.data)
    for name, offset in ((a, m.tensor_offset[b]), (b, m.tensor_offset[a])):
        struct.pack_into("<Q", buf, m.tensors[name].end - 8, offset)  # a tensor info ends with its offset
    return f"offsets of {a} and {b} swapped", bytes(buf)


def counts(rng, m):
    at = rng.choice([8, 16])  # tensor count, metadata count
    (old,) = struct.unpack_from("<Q", m.data, at)
    new = rng.choice([0, 1, old - 1, old + 1, old * 2, 2**32, 2**63])
    buf = bytearray(m.data)
    struct.pack_into("<Q", buf, at, max(0, new))
    return f"{'tensor' if at == 8 else 'metadata'} count {old} -> {new}", bytes(buf)


KINDS = {f.__name__: f for f in (truncate, flip_header, flip_metadata, flip_tensor_info, flip_data, kv_lengths,
                                 kv_type, kv_value, kv_delete, kv_duplicate, chat_template, tensor_offset,
                                 tensor_shape, tensor_type, tensor_name, tensor_swap, counts)}


def mutate(rng: random.Random, m: GGUFMap) -> tuple[str, str, bytes]:
    """(kind, what was done, mutated bytes): one seeded mutation of the file ``m`` maps."""
    kind = rng.choice(list(KINDS))
    what, data = KINDS[kind](rng, m)
    return kind, what, data

