"""llcinfer: a cache-resident CPU inference runtime for GGUF language models.

    >>> from llcinfer import LLM
    >>> llm = LLM("smollm2-135m")
    >>> llm.generate("The capital of France is", max_tokens=8, temperature=0)
"""

__version__ = "0.1.0"


def __getattr__(name):  # lazy: importing llcinfer does not compile kernels
    if name == "LLM":
        from .api import LLM

        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "__version__"]
