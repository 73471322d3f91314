"""SFT rendering of tool-use conversations: the record's tool definitions go into the system turn
as Qwen3/Hermes chat templates put them, assistant tool-call turns are targets, tool definitions
and tool results are not; the Jinja path gets the same tools; records from jsonl (`tools`),
parquet (`tools` as JSON text) and older records (`meta.tools`) all render the tools."""

import json

import numpy as np

from mixtures.reader import ShardReader
from mixtures.sft import JinjaTemplate, SftConfig, encode_segments, materialize_sft, record_tools, render_chatml
from mixtures.tokenizers import load_tokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALLS = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
         {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}]
MESSAGES = [{"role": "system", "content": "detailed thinking off"},
            {"role": "user", "content": "Weather and time in Oslo?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": CALLS},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'},
            {"role": "tool", "tool_call_id": "call_2", "content": '{"time": "14:05"}'},
            {"role": "assistant", "content": "3 C, and it is 14:05."}]

TOOLS_BLOCK = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
               + json.dumps(WEATHER) + "\n" + json.dumps(TIME) + "\n</tools>\n\n"
               "For each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")
EXPECTED = ("<|im_start|>system\ndetailed thinking off\n\n" + TOOLS_BLOCK + "<|im_end|>\n"
            "<|im_start|>user\nWeather and time in Oslo?<|im_end|>\n"
            "<|im_start|>assistant\nLet me check.\n"
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
            '<|im_start|>user\n<tool_response>\n{"temp_c": 3}\n</tool_response>\n<tool_response>\n{"time": "14:05"}\n'
            "</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n3 C, and it is 14:05.<|im_end|>\n")
TARGETS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'
           "3 C, and it is 14:05.<|im_end|>")

# A Hugging Face-style chat template with Qwen3's tool layout (written for this test): tools in the
# system turn, calls with `arguments | tojson` (transformers passes them decoded), results as
# <tool_response> blocks of one user turn.
QWEN_STYLE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for m in messages %}
{%- if m['role'] == 'user' %}
{{- '<|im_start|>user\\n' + m['content'] + '<|im_end|>\\n' }}
{%- elif m['role'] == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (m['content'] or '') }}
{%- for tc in m['tool_calls'] or [] %}
{%- if not loop.first or m['content'] %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>\\n{"name": "' + tc['function']['name'] + '", "arguments": ' + (tc['function']['arguments'] | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif m['role'] == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def test_tools_render_into_the_system_turn_and_only_assistant_turns_are_targets(tokenizer_json):
    segs = render_chatml(MESSAGES, [WEATHER, TIME])
    assert "".join(s for s, _ in segs) == EXPECTED
    assert "".join(s for s, t in segs if t) == TARGETS
    tok = load_tokenizer(tokenizer_json)
    toks, mask = encode_segments(tok, segs)
    assert tok.decode(toks) == EXPECTED and tok.decode(toks[mask == 1]) == TARGETS
    context = tok.decode(toks[mask == 0])
    assert "<tools>" in context and "<tool_response>" in context and "# Tools" in context
    # without tools the same conversation renders as before: no tools block, the system prompt alone
    plain = "".join(s for s, _ in render_chatml(MESSAGES))
    assert plain.startswith("<|im_start|>system\ndetailed thinking off<|im_end|>\n") and "<tools>" not in plain
    assert "".join(s for s, t in render_chatml(MESSAGES) if t) == TARGETS
    # no system message: the tools make one
    no_sys = "".join(s for s, _ in render_chatml(MESSAGES[1:], [WEATHER, TIME]))
    assert no_sys.startswith("<|im_start|>system\n# Tools\n") and no_sys.count("<|im_start|>system") == 1


def test_jinja_templates_get_the_tools_and_decoded_arguments():
    jinja = JinjaTemplate(QWEN_STYLE)
    a, b = jinja.segments(MESSAGES, [WEATHER, TIME]), render_chatml(MESSAGES, [WEATHER, TIME])
    assert "".join(s for s, _ in a) == EXPECTED
    assert "".join(s for s, t in a if t) == "".join(s for s, t in b if t) == TARGETS
    assert MESSAGES[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'     # the record is not changed


def test_record_tools_from_every_place_records_keep_them():
    assert record_tools({"tools": [WEATHER]}) == [WEATHER]
    assert record_tools({"tools": json.dumps([WEATHER])}) == [WEATHER]                  # parquet export: JSON text
    assert record_tools({"meta": {"tools": [TIME]}}) == [TIME]                          # before contract 6 had `tools`
    assert record_tools({"meta": json.dumps({"tools": [TIME]}), "tools": None}) == [TIME]
    assert record_tools({"messages": []}) is None and record_tools({"tools": []}) is None
    for bad in ({"tools": "[{"}, {"tools": [{"name": "x"}]}, {"tools": {"a": 1}}):
        try:
            record_tools(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_tool_records_pack_with_tools_in_context_from_jsonl_and_parquet(tmp_path, tokenizer_json):
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = [{"id": f"t{i}", "kind": "sft", "tools": [WEATHER, TIME], "messages": MESSAGES} for i in range(3)]
    recs.append({"id": "old", "kind": "sft", "meta": {"tools": [WEATHER, TIME]}, "messages": MESSAGES})
    recs.append({"id": "bad", "kind": "sft", "tools": [{"oops": 1}], "messages": MESSAGES})
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    call = pa.struct([("id", pa.string()), ("type", pa.string()),
                      ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
    msg = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(call)),
                     ("tool_call_id", pa.string()), ("name", pa.string())])
    pq.write_table(pa.table({"id": ["pq0"], "tools": [json.dumps([WEATHER, TIME])], "meta": ["{}"],
                             "messages": pa.array([MESSAGES], type=pa.list_(msg))}), tmp_path / "in" / "export.parquet")
    cfg = SftConfig(tokenizer={"kind": "hf", "path": str(tokenizer_json)}, seq_len=1024, inputs=[str(tmp_path / "in")])
    m = materialize_sft(cfg, tmp_path / "sft", progress=lambda s: None)
    assert m.counts["n_conversations"] == 5 and m.counts["quarantined"] == {"tools are not a list of tool definitions": 1}
    tok = load_tokenizer(tokenizer_json)
    n_conv = 0
    for batch in ShardReader(tmp_path / "sft", global_batch_size=1):
        ids, labels, lm = batch["input_ids"][0], batch["labels"][0], batch["loss_mask"][0]
        text = tok.decode(ids)
        n_conv += text.count("# Tools")
        # every window's targets are the assistant turns (tool calls included), never tools or results
        targets = tok.decode(labels[lm])
        assert "<tool_call>" in targets and "<tools>" not in targets and "<tool_response>" not in targets
        assert "get_weather" in tok.decode(np.asarray(labels)[~np.asarray(lm, dtype=bool)])
    assert n_conv >= 1
