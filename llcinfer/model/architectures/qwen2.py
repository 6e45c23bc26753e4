"""Qwen2 / Qwen2.5: llama layout plus biases on the q, k and v projections, and NEOX-style
RoPE (rotate the two halves of each head)."""

from ..gguf_file import GGUFFile
from . import base

NAME = "qwen2"
ROPE_NEOX = True
QKV_BIAS = True


def read_config(f: GGUFFile) -> base.ModelConfig:
    return base.read_config(f, NAME, ROPE_NEOX, QKV_BIAS)


load_weights = base.load_weights
