"""Chat templates: the model's own Jinja template (GGUF tokenizer.chat_template or the Hugging Face
directory's), or Gemma's documented turn format when the model has none."""
from __future__ import annotations

# Gemma's turn format (ai.google.dev/gemma/docs/core/prompt-structure): a system message is
# folded into the first user turn; the assistant role is called "model".
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set ns.system = ns.system + m['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] in ('assistant', 'model') else m['role']) + '\n' }}"
    "{%- if m['role'] == 'user' and ns.system -%}{{ ns.system }}{%- set ns.system = '' -%}{%- endif -%}"
    "{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def _check_messages(messages):
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be a dict with string 'role' and 'content'")
        if m["role"] not in ("system", "user", "assistant", "model"):
            raise ValueError(f"messages[{i}]: unknown role {m['role']!r}")


def render_chat(messages, template: str | None, bos_text: str = "<bos>") -> str:
    _check_messages(messages)
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ValueError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        tpl = env.from_string(template or GEMMA_TEMPLATE)
        return tpl.render(messages=list(messages), bos_token=bos_text, eos_token="<eos>",
                          add_generation_prompt=True)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template failed to render: {e}") from e
