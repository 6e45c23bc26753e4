"""Chat template tests: the real SmolLM2 and Qwen2.5 templates, HF-compatible globals, errors."""

import json
import re

import pytest

from llcinfer.model.chat_template import ChatTemplate
from llcinfer.errors import ChatTemplateError
from llcinfer.model.tokenizer import Tokenizer

CONVERSATION = [
    {"role": "system", "content": "You are a terse bot."},
    {"role": "user", "content": "Hi there!"},
]


from real_models import real_model_path as model_path  # fetched on first use, never skipped


_CACHE: dict = {}


def real_template(name: str) -> ChatTemplate:
    """ChatTemplate.from_metadata of a catalog model (loaded once per session)."""
    if name not in _CACHE:
        from llcinfer.model.gguf_file import GGUFFile

        meta = GGUFFile(model_path(name)).metadata
        _CACHE[name] = ChatTemplate.from_metadata(meta, Tokenizer.from_metadata(meta))
    return _CACHE[name]


# ---------------------------------------------------------------- SmolLM2
def test_smollm2_template():
    tpl = real_template("smollm2-135m")
    expected = ("<|im_start|>system\nYou are a terse bot.<|im_end|>\n"
                "<|im_start|>user\nHi there!<|im_end|>\n")
    assert tpl.render(CONVERSATION, add_generation_prompt=False) == expected
    assert tpl.render(CONVERSATION) == expected + "<|im_start|>assistant\n"
    assert tpl.bos_token == "<|im_start|>" and tpl.eos_token == "<|im_end|>"


def test_smollm2_template_default_system_prompt():
    tpl = real_template("smollm2-135m")
    assert tpl.render([{"role": "user", "content": "2+2?"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------- Qwen2.5
def test_qwen25_template():
    tpl = real_template("qwen2.5-coder-0.5b")
    expected = ("<|im_start|>system\nYou are a terse bot.<|im_end|>\n"
                "<|im_start|>user\nHi there!<|im_end|>\n")
    assert tpl.render(CONVERSATION, add_generation_prompt=False) == expected
    assert tpl.render(CONVERSATION, add_generation_prompt=True) == expected + "<|im_start|>assistant\n"


def test_qwen25_template_default_system_and_multiturn():
    tpl = real_template("qwen2.5-coder-0.5b")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}]
    assert tpl.render(messages) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
        "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n")


def test_qwen25_tools_use_unescaped_tojson():
    tpl = real_template("qwen2.5-coder-0.5b")
    tool = {"type": "function", "function": {"name": "f", "description": "a <b> & 'c' é"}}
    out = tpl.render(CONVERSATION, tools=[tool])
    assert "<tools>\n" + json.dumps(tool, ensure_ascii=False) + "\n</tools>" in out
    assert out.endswith("<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------- environment
def test_hf_globals_and_options():
    tpl = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ bos_token }}{{ m | tojson }}{{ eos_token }}{% endfor %}\n"
        "{% if add_generation_prompt %}{{ strftime_now('%Y') }}{% endif %}",
        bos_token="<s>", eos_token="</s>")
    out = tpl.render(CONVERSATION)
    assert out.startswith('<s>{"role": "system", "content": "You are a terse bot."}</s>')
    assert re.fullmatch(r".*</s>\d{4}", out, re.S)  # trim_blocks removed the newline after endfor
    assert tpl.render(CONVERSATION, add_generation_prompt=False).endswith("</s>")


def test_from_metadata_without_template():
    assert ChatTemplate.from_metadata({}, None) is None
    tpl = ChatTemplate.from_metadata({"tokenizer.chat_template": "{{ messages[0].content }}"}, None)
    assert tpl.render([{"role": "user", "content": "x"}]) == "x"


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("messages", [
    "hello",
    [("user", "hi")],
    [{"role": "user"}],
    [{"content": "hi"}],
    [{"role": "user", "content": None}],
    [{"role": 3, "content": "hi"}],
    [{"role": "", "content": "hi"}],
])
def test_malformed_messages(messages):
    tpl = ChatTemplate("{{ messages }}")
    with pytest.raises(ChatTemplateError) as info:
        tpl.render(messages)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("source", ["{% for m in messages %}", "{{ messages[0] ", "{% endif %}", ""])
def test_syntax_errors(source):
    with pytest.raises(ChatTemplateError) as info:
        ChatTemplate(source)
    assert "\n" not in str(info.value)


def test_raise_exception_and_runtime_errors():
    tpl = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok")
    assert tpl.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="first must be user"):
        tpl.render(CONVERSATION)
    with pytest.raises(ChatTemplateError, match="^chat template error: first line$"):  # one line of it
        ChatTemplate("{{ raise_exception('first line\\nsecond line') }}").render(CONVERSATION)
    with pytest.raises(ChatTemplateError):  # the immutable sandbox refuses mutation
        ChatTemplate("{{ messages.append(1) }}").render(CONVERSATION)
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ 1 / 0 }}").render(CONVERSATION)
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[5].content }}").render(CONVERSATION)


@pytest.mark.parametrize("source", [
    "{% for i in range(10**9) %}x{% endfor %}",  # the sandbox's range limit: OverflowError
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",  # RecursionError
])
def test_templates_that_overflow_or_recurse(source):
    with pytest.raises(ChatTemplateError, match="failed to render: (OverflowError|RecursionError)") as info:
        ChatTemplate(source).render(CONVERSATION)
    assert "\n" not in str(info.value)
