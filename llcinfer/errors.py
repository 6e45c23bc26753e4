"""Typed exceptions raised by llcinfer.

Every error a user can cause is an ``LLCInferError``; the command line turns it into one
line on stderr and the exit code in ``exit_code`` (2 for usage errors, 1 for runtime
errors).
"""


class LLCInferError(Exception):
    """Base class of every error llcinfer raises on purpose."""

    exit_code = 1


class UsageError(LLCInferError, ValueError):
    """An argument is out of its valid range (temperature < 0, top-p outside (0, 1], ...)."""

    exit_code = 2


class ModelFileError(LLCInferError):
    """The model file is missing, not a GGUF, truncated or inconsistent."""


class UnsupportedModelError(LLCInferError):
    """The GGUF is valid but uses an architecture or tensor type llcinfer does not run."""


class ConfigError(LLCInferError):
    """A controller configuration is malformed: the message names the path of the bad node."""

    exit_code = 2


class CatalogError(LLCInferError):
    """An unknown catalog name, or a catalog entry that cannot be used."""

    exit_code = 2


class DownloadError(LLCInferError):
    """Fetching or assembling a catalog model failed."""


class ContextLengthError(LLCInferError):
    """The prompt (plus generation) does not fit in the context window."""


class TokenizerError(LLCInferError):
    """The GGUF vocabulary cannot be turned into a tokenizer."""


class ChatTemplateError(LLCInferError):
    """The chat template failed to render, or the messages are malformed."""


class OutOfMemoryError(LLCInferError):
    """Memory for the model, KV cache or buffers could not be allocated."""


def check_prompt_fits(n_prompt: int, n_ctx: int) -> None:
    """``ContextLengthError`` when a prompt of ``n_prompt`` tokens exceeds the context."""
    if n_prompt > n_ctx:
        raise ContextLengthError(f"prompt of {n_prompt} tokens exceeds the context length {n_ctx}")
