"""Shared by the speculative-decoding tests: a verification cost under which every tree
pays, and the tiny target and draft models."""

from llcinfer.engine.sampling import SamplingParams
from llcinfer.speculative import VerifyCost

from tiny_models import write_tiny_model

FREE = VerifyCost(k_max=64, slope_s=0.0, base_s=1e-3, decode_s=1.0)  # every tree pays: the verification path runs


def write_spec_pair(d):
    """(target, draft) paths in folder ``d``: a 3-layer llama and a 1-layer one of the same vocabulary."""
    target = write_tiny_model(d / "target.gguf", "llama", "Q8_0", n_layer=3, seed=11, n_ctx=512)
    draft = write_tiny_model(d / "draft.gguf", "llama", "Q8_0", n_layer=1, seed=11, n_ctx=512)
    return target, draft


def generate_tokens(llm, prompts, **kw) -> list[list[int]]:
    """The token ids ``llm``'s engine generates for each prompt, greedy and 40 tokens unless ``kw`` says."""
    params = SamplingParams(**{"temperature": 0, "max_tokens": 40, "ignore_eos": True, **kw})
    return [c.token_ids for c in llm.engine.generate(prompts, params)]
