"""Chat templates: render a GGUF ``tokenizer.chat_template`` the way HF transformers does.

transformers compiles the template in an ``ImmutableSandboxedEnvironment`` with
``trim_blocks``/``lstrip_blocks`` and the ``loopcontrols`` extension, replaces the ``tojson``
filter by a plain ``json.dumps`` (no HTML escaping), and exposes ``raise_exception`` and
``strftime_now``.  The template sees ``messages``, ``add_generation_prompt``, ``tools``,
``documents`` and the tokenizer's special-token strings (``bos_token``, ``eos_token``, ...).
"""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ChatTemplateError

TEMPLATE_KEY = "tokenizer.chat_template"


def _raise_exception(message):
    raise ChatTemplateError(f"chat template error: {_one_line(message)}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Like transformers: Jinja's own tojson HTML-escapes '<', '>', '&' and "'", which templates
    # that embed tool schemas must not do.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _one_line(what: BaseException | str) -> str:
    """The first line of an exception's message (or of a text), at most 200 characters."""
    lines = str(what).strip().splitlines()
    return (lines[0] if lines else "" if isinstance(what, str) else type(what).__name__)[:200]


def validate_messages(messages) -> None:
    """Raise ChatTemplateError unless ``messages`` is a list of {'role': str, 'content': str} dicts."""
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of dicts, not {type(messages).__name__}")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ChatTemplateError(f"message {i} must be a dict with 'role' and 'content', not {type(msg).__name__}")
        for key in ("role", "content"):
            if key not in msg:
                raise ChatTemplateError(f"message {i} has no '{key}'")
            if not isinstance(msg[key], str):
                raise ChatTemplateError(f"message {i}: '{key}' must be a string, not {type(msg[key]).__name__}")
        if not msg["role"]:
            raise ChatTemplateError(f"message {i}: 'role' must not be empty")


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("chat template is empty")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template syntax error (line {exc.lineno}): {_one_line(exc)}") from None
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template cannot be compiled: {_one_line(exc)}") from None

    @classmethod
    def from_metadata(cls, meta: dict, tokenizer) -> "ChatTemplate | None":
        """The GGUF's template, or None when the file has none.

        ``bos_token``/``eos_token`` are the vocabulary texts of the tokenizer's BOS/EOS ids.
        """
        source = meta.get(TEMPLATE_KEY)
        if not source:
            return None

        def text(tid):
            return tokenizer.token_text(tid) if tokenizer is not None and tid is not None else ""

        return cls(source, text(getattr(tokenizer, "bos_id", None)), text(getattr(tokenizer, "eos_id", None)))

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """The prompt text for ``messages``; ``extra`` adds template variables (e.g. ``tools``)."""
        validate_messages(messages)
        variables = {
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": bool(add_generation_prompt),
            "tools": None,
            "documents": None,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        variables.update(extra)
        try:
            return self._template.render(**variables)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed to render: {_one_line(exc)}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError, RecursionError) as exc:
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {_one_line(exc)}") from None
