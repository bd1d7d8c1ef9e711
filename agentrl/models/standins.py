"""Stand-in models of pretrained families: laid out like the real ones, with tiny random weights.

No pretrained weights can be fetched here, so tests (and a user checking a new family, `jobs.check_model`)
use directories built the way Qwen2.5-, Llama-3.1- and GLM-4-Instruct directories are: the family's
architecture in `config.json` (bf16), its special tokens in a byte-level BPE tokenizer, its end-of-turn
tokens in `generation_config.json`, and a chat template in the tokenizer config. The templates are written
here, in our own words, to behave like each family's in what matters to a trainer: where tools go
(JSON schemas in the system prompt, or in the first user message), how calls look (Hermes `<tool_call>`
JSON, Llama's bare `{"name", "parameters"}` JSON, GLM's `<arg_key>/<arg_value>` pairs), the role of tool
results (grouped under one `user` turn, `ipython`, `<|observation|>`) and how a turn ends (`<|im_end|>`,
`<|eot_id|>`/`<|eom_id|>`, the next role token). The real templates differ in wording, not in structure.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from agentrl.models import tiny

# Qwen2.5-like: tools as JSON lines inside <tools>, calls as <tool_call> JSON on their own lines, every run of
# consecutive tool results grouped into one user turn of <tool_response> blocks.
QWEN_TEMPLATE = (
    "{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' else 'You are a helpful assistant.' -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n' + sys + '\\n\\n# Tools\\n\\nFunctions you may call, one JSON schema per line:\\n<tools>' }}"
    "{%- for t in tools -%}{{ '\\n' + (t | tojson) }}{%- endfor -%}"
    "{{ '\\n</tools>\\n\\nTo call one, answer with its name and arguments as JSON inside <tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <name>, \"arguments\": <arguments as an object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>system\\n' + sys + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' and loop.first -%}"
    "{%- elif m['role'] == 'user' or m['role'] == 'system' -%}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant' }}{%- if m['content'] or not m.get('tool_calls') -%}{{ '\\n' + (m['content'] or '') }}{%- endif -%}"
    "{%- for c in m.get('tool_calls') or [] -%}"
    "{%- set a = c['function']['arguments'] -%}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + c['function']['name'] + '\", \"arguments\": ' + (a if a is string else (a | tojson)) + '}\\n</tool_call>' }}"
    "{%- endfor -%}{{ '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\\n<tool_response>\\n' + (m['content'] or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Llama-3.1-like: a dated system header, tools in the first user message, calls as bare JSON with
# "parameters", results under the `ipython` role, every message closed by <|eot_id|> (content trimmed).
LLAMA_TEMPLATE = (
    "{{- '<|begin_of_text|>' -}}"
    "{%- set date_string = date_string if date_string is defined else '26 Jul 2024' -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}{%- set sys = messages[0]['content'] | trim -%}"
    "{%- set rest = messages[1:] -%}{%- else -%}{%- set sys = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' -}}"
    "{%- if tools -%}{{- 'Environment: ipython\\n' -}}{%- endif -%}"
    "{{- 'Knowledge cutoff: December 2023\\nToday: ' + date_string + '\\n\\n' + sys + '<|eot_id|>' -}}"
    "{%- set first = namespace(done=false) -%}"
    "{%- for m in rest -%}"
    "{%- if m['role'] == 'user' and tools and not first.done -%}{%- set first.done = true -%}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\nThese functions are available. To use one, answer with JSON only, "
    "in the form {\"name\": function name, \"parameters\": an object of argument values}.\\n\\n' -}}"
    "{%- for t in tools -%}{{- (t | tojson) + '\\n\\n' -}}{%- endfor -%}"
    "{{- (m['content'] | trim) + '<|eot_id|>' -}}"
    "{%- elif m['role'] == 'assistant' and m.get('tool_calls') -%}"
    "{%- set c = m['tool_calls'][0]['function'] -%}{%- set a = c['arguments'] -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n{\"name\": \"' + c['name'] + '\", \"parameters\": ' + (a if a is string else (a | tojson)) + '}<|eot_id|>' -}}"
    "{%- elif m['role'] == 'tool' or m['role'] == 'ipython' -%}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' -}}"
    "{%- else -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

# GLM-4-like: [gMASK]<sop> prefix, role tokens without closing tokens (a turn ends where the next role token
# starts: <|user|>, <|observation|>), calls as <tool_call>name then <arg_key>/<arg_value> pairs.
GLM_TEMPLATE = (
    "{{- '[gMASK]<sop>' -}}"
    "{%- if tools -%}{{- '<|system|>\\n# Tools\\n\\nYou can call these functions; their schemas, one per line:\\n<tools>\\n' -}}"
    "{%- for t in tools -%}{{- (t | tojson) + '\\n' -}}{%- endfor -%}"
    "{{- '</tools>\\n\\nWrite each call as:\\n<tool_call>{name}\\n<arg_key>{key}</arg_key>\\n<arg_value>{value}</arg_value>\\n...\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{{- '<|system|>\\n' + (m['content'] or '') -}}"
    "{%- elif m['role'] == 'user' -%}{{- '<|user|>\\n' + (m['content'] or '') -}}"
    "{%- elif m['role'] == 'assistant' -%}{{- '<|assistant|>\\n' + (m['content'] or '') -}}"
    "{%- for c in m.get('tool_calls') or [] -%}"
    "{%- set a = c['function']['arguments'] -%}"
    "{{- '<tool_call>' + c['function']['name'] + '\\n' -}}"
    "{%- for k, v in a.items() -%}{{- '<arg_key>' + k + '</arg_key>\\n<arg_value>' + (v if v is string else (v | tojson)) + '</arg_value>\\n' -}}{%- endfor -%}"
    "{{- '</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + (m['content'] or '') + '\\n</tool_response>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


# Families whose shipped templates lay out no tools (the model sees a tool-using task as plain chat), in our
# words: SmolLM2-Instruct's plain ChatML with a default system turn; Gemma's turns, which also refuse a system
# message; Phi-3's role tokens closed by <|end|>; Zephyr-style turns (TinyLlama-Chat), for which agentrl has no
# template of its own (a user brings one).
SMOLLM_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}{{ '<|im_start|>system\nYou are a helpful assistant named Smol.<|im_end|>\n' }}{%- endif -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + (m['content'] or '') + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}{{ raise_exception('System role not supported') }}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (m['content'] or '') + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
PHI3_TEMPLATE = (
    "{%- for m in messages -%}{{ '<|' + m['role'] + '|>\n' + (m['content'] or '') + '<|end|>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)
ZEPHYR_TEMPLATE = (
    "{%- for m in messages -%}{{ '<|' + m['role'] + '|>\n' + (m['content'] or '') + eos_token + '\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class Family:
    """What a stand-in of one model family is made of."""

    name: str
    architecture: str  # transformers config class name
    special_tokens: tuple[str, ...]  # the tokenizer's added special tokens, in id order
    eos: str  # the tokenizer's eos token
    stops: tuple[str, ...]  # generation_config.json's eos_token_id, as token strings
    template: str
    parser: str  # the vLLM tool parser that `model.tool_parser: auto` should pick
    fix: str = ""  # tool-less families: agentrl's template (model.chat_template) for its turns ("": none of ours)


FAMILIES: dict[str, Family] = {
    "qwen2.5": Family("qwen2.5", "Qwen2Config",
                      ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
                      "<|im_end|>", ("<|im_end|>", "<|endoftext|>"), QWEN_TEMPLATE, "hermes"),
    "llama3.1": Family("llama3.1", "LlamaConfig",
                       ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
                       "<|eot_id|>", ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"), LLAMA_TEMPLATE, "llama3_json"),
    "glm4": Family("glm4", "Glm4Config",
                   ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                    "<tool_response>", "</tool_response>"),
                   "<|endoftext|>", ("<|endoftext|>", "<|user|>", "<|observation|>"), GLM_TEMPLATE, "glm45"),
}

TOOLLESS: dict[str, Family] = {
    "smollm2": Family("smollm2", "LlamaConfig", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|im_end|>",
                      ("<|im_end|>",), SMOLLM_TEMPLATE, "hermes", "chatml-tools"),
    "gemma": Family("gemma", "GemmaConfig", ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), "<eos>",
                    ("<eos>", "<end_of_turn>"), GEMMA_TEMPLATE, "hermes", "gemma-tools"),
    "phi3": Family("phi3", "Phi3Config", ("<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
                   "<|endoftext|>", ("<|endoftext|>", "<|end|>"), PHI3_TEMPLATE, "hermes", "phi3-tools"),
    "zephyr": Family("zephyr", "LlamaConfig", ("<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"), "</s>",
                     ("</s>",), ZEPHYR_TEMPLATE, "hermes", "own-tools"),
}
"""Stand-ins of families whose own template ignores tools: `ChatFormat` refuses them until `model.chat_template`
names a template that lays tools out (`fix`: one of ours for the family's turn tokens, or own-tools, which gives
the family's own template the tools)."""

BASE: dict[str, Family] = {
    "gemma-base": Family("gemma-base", "GemmaConfig", ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), "<eos>",
                         ("<eos>",), "", "hermes", "gemma-tools"),
    "llama3-base": Family("llama3-base", "LlamaConfig",
                          ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>"), "<|end_of_text|>", ("<|end_of_text|>",), "", "hermes", "llama3-tools"),
    "chatml-base": Family("chatml-base", "Qwen2Config", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                          "<|endoftext|>", ("<|endoftext|>",), "", "hermes", "chatml-tools"),
    "plain-base": Family("plain-base", "LlamaConfig", ("<s>", "</s>"), "</s>", ("</s>",), "", "hermes", "plain-tools"),
}
"""Stand-ins of base (pretrained, not instruct) checkpoints as their GGUFs come: no chat template at all, and a
generation config naming only the eos. Their turn tokens, where the vocabulary has any, were never trained; the
template that fits (`fix`) brings its turn end as a stop (`ChatFormat.turn_end_id`)."""

_CORPUS = [
    'What is the code of item bako? {"name": "lookup", "arguments": {"name": "bako", "field": "code"}}',
    "The answer is 41. Read the note, then enter the code it shows. name=bako code=41 color=red",
    '{"type": "function", "function": {"name": "submit_answer", "description": "Answer.", "parameters": '
    '{"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}',
    "You are a helpful assistant. Functions you may call, schemas, arguments, observation, results 0123456789",
]


def build(family: str, out_dir: str | Path, seed: int = 0, hidden_size: int = 128, num_layers: int = 2,
          vocab_size: int = 700, max_position: int = 4096, dtype: str = "bfloat16") -> Path:
    """Write a stand-in model directory of `family` (a key of FAMILIES, TOOLLESS or BASE) to `out_dir`; returns it."""
    import transformers

    f = FAMILIES.get(family) or TOOLLESS.get(family) or BASE[family]
    corpus = _CORPUS * 8
    tok = tiny.train_tokenizer(corpus, vocab_size, list(f.special_tokens), f.template, f.eos, f.eos)
    if not f.template:  # a base model: no chat template saved at all
        tok.chat_template = None
    torch.manual_seed(seed)
    config_cls = getattr(transformers, f.architecture)
    ids = [tok.convert_tokens_to_ids(t) for t in f.stops]
    config = config_cls(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                        num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64,
                        num_key_value_heads=hidden_size // 64, head_dim=64, max_position_embeddings=max_position,
                        tie_word_embeddings=False, eos_token_id=ids, pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.convert_tokens_to_ids(f.special_tokens[0]), dtype=dtype)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = ids
    model = model.to(getattr(torch, dtype))
    out = tiny.save(model, tok, out_dir, probe=corpus[0])
    # Read the family back as a user's directory would be read: its template and stop tokens round-trip.
    meta = json.loads((out / "generation_config.json").read_text())
    if meta.get("eos_token_id") != ids:
        raise RuntimeError(f"{family}: generation_config.json lost its eos_token_id ({meta.get('eos_token_id')})")
    return out
