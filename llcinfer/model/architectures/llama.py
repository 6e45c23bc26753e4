"""Llama family (Llama 2/3, SmolLM, Mistral-style dense models).

GGUF conversion permutes the Q/K rows for llama so that RoPE rotates adjacent pairs
(ggml's "normal" mode); no biases on the projections.
"""

from ..gguf_file import GGUFFile
from . import base

NAME = "llama"
ROPE_NEOX = False
QKV_BIAS = False


def read_config(f: GGUFFile) -> base.ModelConfig:
    return base.read_config(f, NAME, ROPE_NEOX, QKV_BIAS)


load_weights = base.load_weights
