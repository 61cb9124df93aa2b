"""Role markers derived from tokenizer chat templates, and the ChatML fallback."""

from __future__ import annotations

import logging

import jinja2
import pytest

from radixlm.lang import chat_template as ct


class TemplateTokenizer:
    """Renders a jinja chat template the way transformers does (enough for probes)."""

    def __init__(self, template: str | None, bos: str = "<s>"):
        self.chat_template = template
        self.name_or_path = "fake"
        self._template = jinja2.Template(template) if template else None
        self.bos = bos

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert not tokenize
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=self.bos
        )


LLAMA3_LIKE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<turn>{{ m['role'] }}\n{{ m['content'] }}<end>\n{% endfor %}"
)
MERGED_SYSTEM = (  # Llama-2 style, without a generation prompt
    "{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>{{ m['content'] }}<</SYS>>"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %} {{ m['content'] }}"
    "</s>{% endif %}{% endfor %}"
)


def test_bundled_model_markers_equal_its_template(tmp_path):
    from transformers import AutoTokenizer

    from radixlm.runtime.executor.model_registry import local_hf_dir

    tok = AutoTokenizer.from_pretrained(local_hf_dir("smollm2-135m"))
    t = ct.from_tokenizer(tok)
    assert t.role_prefix_and_suffix == ct.CHATML.role_prefix_and_suffix
    assert t.preamble == ""
    messages = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    built = "".join(
        t.get_prefix_and_suffix(m["role"])[0] + m["content"] + t.get_prefix_and_suffix(m["role"])[1]
        for m in messages
    )
    assert built == tok.apply_chat_template(messages, tokenize=False)


def test_preamble_split_from_system_marker():
    t = ct.from_tokenizer(TemplateTokenizer(LLAMA3_LIKE))
    assert t.preamble == "<s>"
    assert t.get_prefix_and_suffix("system") == (
        "<|start_header_id|>system<|end_header_id|>\n\n",
        "<|eot_id|>",
    )
    assert t.get_prefix_and_suffix("assistant")[0] == (
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


@pytest.mark.parametrize("template", [None, NO_SYSTEM, MERGED_SYSTEM])
def test_fallback_to_chatml(template, caplog):
    with caplog.at_level(logging.INFO, logger="radixlm.lang.chat_template"):
        t = ct.from_tokenizer(TemplateTokenizer(template))
    assert t is ct.CHATML
    assert caplog.records  # the fallback is logged


def test_unknown_role_is_an_error():
    with pytest.raises(ValueError, match="no role"):
        ct.CHATML.get_prefix_and_suffix("tool")


def test_for_model_falls_back_when_tokenizer_missing(caplog):
    with caplog.at_level(logging.WARNING, logger="radixlm.lang.chat_template"):
        assert ct.for_model("/nonexistent/model-dir") is ct.CHATML
    assert "ChatML" in caplog.text
