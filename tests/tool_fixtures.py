"""Models for the tool-calling tests: a byte-level tokenizer (it can write JSON and the call markup) with a
chat template that renders ``tools`` in each supported format, over a random SDAR model (Qwen/Hermes
template, ``<tool_call>`` markup) and a random LLaDA2 model (the shared conformance checkpoint, with a
LLaDA2.x / Ling-style template: ``<role>...</role>`` turns, tool results in ``<role>OBSERVATION</role>``).

``<tool_call>`` is one token of these tokenizers (as in Qwen's), so a ``logit_bias`` on it makes a random
model open a call where it would otherwise write text (the ``auto`` tests).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import FIXTURES, make_random_sdar
from structured_fixtures import EOS, MASK, _corpus

TOOL_CALL = "<tool_call>"

#: A Qwen-style template (written for these tests): tools in the system turn, calls as <tool_call> JSON.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools>\n"
    'Call a tool as <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call><|im_end|>\n'
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}"
    '{% if loop.first and m.content or not loop.first %}\n{% endif %}<tool_call>\n{"name": "'
    '{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: A LLaDA2.x / Ling-style template (written for these tests): <role> turns, OBSERVATION for results.
LLADA2_TEMPLATE = (
    "<role>SYSTEM</role>{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "{%- if tools %}# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
    'For each call write <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>\n{% endif %}'
    "detailed thinking off<|role_end|>"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}<role>HUMAN</role>{{ m.content }}<|role_end|>"
    "{%- elif m.role == 'assistant' %}<role>ASSISTANT</role>{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}"
    '{% if loop.first and m.content or not loop.first %}\n{% endif %}<tool_call>\n{"name": "'
    '{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|role_end|>"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<role>OBSERVATION</role>{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|role_end|>{% endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}"
)


def _trained(vocab_size: int):
    """A byte-level BPE tokenizer trained on the structured-output corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_corpus(), trainer)
    return tok


def _add_call_token(tok) -> None:
    from tokenizers import AddedToken

    assert tok.add_tokens([AddedToken(TOOL_CALL, special=False, normalized=False)]) == 1


def _save(tok, directory: Path, template: str) -> Path:
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "mask_token": MASK,
    }
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def make_sdar_tool_model(directory: Path, *, seed: int = 0, template: str | None = HERMES_TEMPLATE) -> Path:
    """A random SDAR model over a ~320-token byte-level tokenizer with ``<tool_call>``, EOS and MASK last
    (as :func:`conftest.make_random_sdar` expects) and the Hermes template (None: no template)."""
    tok = _trained(320)
    _add_call_token(tok)
    tok.add_special_tokens([EOS, MASK])
    make_random_sdar(directory, vocab=tok.get_vocab_size(), seed=seed, max_positions=2048)
    return _save(tok, directory, template)


def make_llada2_tool_model(directory: Path) -> Path:
    """The shared LLaDA2 checkpoint (vocabulary 512, EOS 503, mask 509) with a byte-level tokenizer
    padded to those ids and the LLaDA2-style template."""
    src = FIXTURES / "llada2"
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "added_tokens.json"):
        shutil.copy(src / name, directory / name)
    tok = _trained(480)
    _add_call_token(tok)
    filler = [f"<|reserved_{i}|>" for i in range(503 - tok.get_vocab_size())]
    tok.add_special_tokens(filler)
    tok.add_special_tokens([EOS])  # 503
    tok.add_special_tokens([f"<|reserved_x{i}|>" for i in range(5)])  # 504..508
    tok.add_special_tokens([MASK])  # 509
    assert tok.token_to_id(EOS) == 503 and tok.token_to_id(MASK) == 509
    return _save(tok, directory, LLADA2_TEMPLATE)
