"""A model file opened for its text side: the GGUF's path, metadata and configuration, its
tokenizer and chat template; no weights are repacked and no kernel is compiled.

``LLM`` builds on one.  The command line opens one before it builds the ``LLM``, so that
input that cannot run (a prompt longer than the context, a text too short to score)
fails within a second instead of after the kernels are compiled and calibrated.
"""

from __future__ import annotations

import os

from ..errors import ChatTemplateError, UsageError
from . import catalog
from .architectures import get_architecture
from .architectures.base import ModelConfig
from .chat_template import ChatTemplate
from .gguf_file import GGUFFile
from .tokenizer import Tokenizer


class ModelFile:
    """``model``: a catalog name (fetched if missing), a path to a .gguf file, or None for
    the default catalog model."""

    def __init__(self, model: str | os.PathLike | None = None, progress: bool = True):
        self.path = catalog.resolve_model(model, progress=progress)
        self.gguf = GGUFFile(self.path)
        arch = get_architecture(self.gguf.require("general.architecture"))
        # the configuration first: it checks the vocabulary against the embedding's rows
        self.config: ModelConfig = arch.read_config(self.gguf)
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        self.chat_template = ChatTemplate.from_metadata(self.gguf.metadata, self.tokenizer)

    def tokenize(self, text: str, special: bool = False, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; ``special=True`` parses special tokens such as <|im_start|>."""
        if not isinstance(text, str):
            raise UsageError(f"text must be a str (got {type(text).__name__})")
        return self.tokenizer.encode(text, special=special, add_bos=add_bos)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the chat template makes of ``messages``."""
        if self.chat_template is None:
            raise ChatTemplateError(f"{self.path.name} has no chat template (tokenizer.chat_template)")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    def prompt_ids(self, prompt: str | list[dict]) -> list[int]:
        """A request's prompt tokens: raw text as it is (BOS as the tokenizer adds it), or a
        conversation ``[{"role": ..., "content": ...}, ...]`` put through the chat template."""
        if isinstance(prompt, list):
            return self.tokenize(self.apply_chat_template(prompt), special=True)
        return self.tokenize(prompt, special=False, add_bos=None)
