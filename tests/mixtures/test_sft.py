"""SFT rendering (system toggles, tool calls) with loss masks on assistant tokens only, and packing."""

import json

import numpy as np
import pytest

from mixtures.reader import ShardReader
from mixtures.sft import JinjaTemplate, SftConfig, encode_segments, materialize_sft, render_chatml
from mixtures.shards import ShardSet
from mixtures.tokenizers import CHATML_JINJA, load_tokenizer


def _records():
    recs = []
    for i in range(40):
        think = "on" if i % 2 else "off"
        msgs = [{"role": "system", "content": f"detailed thinking {think}"},
                {"role": "user", "content": f"what is {i} plus {i}?"},
                {"role": "assistant", "content": (f"<think>\n{i} and {i} makes {2 * i}\n</think>\n\n" if think == "on" else "")
                 + f"The answer is {2 * i}."}]
        recs.append({"id": f"r{i}", "kind": "sft", "system": f"detailed thinking {think}", "messages": msgs})
    recs.append({"id": "tool", "kind": "sft", "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21C"},
        {"role": "assistant", "content": "It is sunny and 21C in Paris."}]})
    recs.append({"id": "bad", "kind": "sft", "messages": [{"role": "user", "content": "no answer"}]})
    return recs


def test_chatml_rendering_masks_only_assistant_tokens(tokenizer_json):
    tok = load_tokenizer(tokenizer_json)
    rec = _records()[-2]
    segs = render_chatml(rec["messages"])
    text = "".join(s for s, _ in segs)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny, 21C\n</tool_response><|im_end|>" in text
    targets = "".join(s for s, t in segs if t)
    assert targets == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
                       "It is sunny and 21C in Paris.<|im_end|>")
    toks, mask = encode_segments(tok, segs)
    assert toks.size == mask.size
    assert tok.decode(toks[mask == 1]) == targets
    assert tok.decode(toks) == text
    im_end = tok.token_to_id("<|im_end|>")
    assert (toks == im_end).sum() == 4 and mask[toks == im_end].sum() == 2   # assistant turns end on a target


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather.",
                                                  "parameters": {"type": "object",
                                                                 "properties": {"city": {"type": "string"}},
                                                                 "required": ["city"]}}}


def _tool_conversation(system: bool) -> list[dict]:
    """Two parallel calls, two consecutive tool results, then the answer."""
    calls = [{"id": f"c{k}", "type": "function",
              "function": {"name": "get_weather",
                           "arguments": json.dumps({"city": city}, ensure_ascii=False)}}
             for k, city in enumerate(["Paris", "Köln"])]
    msgs = [{"role": "system", "content": "You are terse."}] if system else []
    return msgs + [{"role": "user", "content": "weather in Paris and Köln?"},
                   {"role": "assistant", "content": "Checking both.", "tool_calls": calls},
                   {"role": "tool", "tool_call_id": "c0", "content": "sunny, 21C"},
                   {"role": "tool", "tool_call_id": "c1", "content": "rain, 12C"},
                   {"role": "assistant", "content": "Paris: sunny. Köln: rain."}]


@pytest.mark.parametrize("case", ["plain", "thinking", "tool", "tools-with-system", "tools-no-system"])
def test_the_exported_chat_template_renders_what_was_trained(case):
    """The Jinja template stored with trained tokenizers (what `transformers` uses at inference)
    produces the same text and the same targets as the packer's renderer, tools included."""
    recs = _records()
    messages, tools = {"plain": (recs[2]["messages"], None), "thinking": (recs[3]["messages"], None),
                       "tool": (recs[-2]["messages"], None),
                       "tools-with-system": (_tool_conversation(True), [WEATHER_TOOL]),
                       "tools-no-system": (_tool_conversation(False), [WEATHER_TOOL])}[case]
    jinja = JinjaTemplate(CHATML_JINJA)
    a, b = jinja.segments(messages, tools=tools), render_chatml(messages, tools=tools)
    assert "".join(s for s, _ in a) == "".join(s for s, _ in b)
    assert "".join(s for s, t in a if t) == "".join(s for s, t in b if t)
    if tools:
        text = "".join(s for s, _ in b)
        assert text.count("<|im_start|>system") == 1 and '"name": "get_weather"' in text
        assert "</tool_response>\n<tool_response>" in text          # consecutive results share one turn
    prompt = jinja.render(messages[:1 + (messages[0]["role"] == "system")], add_generation_prompt=True, tools=tools)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_sft_shards_pack_whole_conversations(tmp_path, tokenizer_json):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _records()) + "\n")
    cfg = SftConfig(tokenizer={"kind": "hf", "path": str(tokenizer_json)}, seq_len=256, inputs=[str(path)], seed=3)
    m = materialize_sft(cfg, tmp_path / "sft", progress=lambda s: None)
    assert m.kind == "sft" and m.counts["n_conversations"] == 41
    assert m.counts["quarantined"] == {"no assistant turn": 1}
    assert m.n_tokens % 256 == 1                         # every window padded to seq_len
    ss = ShardSet.open(tmp_path / "sft", verify_hashes=True)
    assert ss.has_mask
    tok = load_tokenizer(tokenizer_json)
    start = tok.token_to_id("<|im_start|>")
    r = ShardReader(tmp_path / "sft", global_batch_size=1)
    n_targets = 0
    for batch in r:
        ids, labels, lm = batch["input_ids"][0], batch["labels"][0], batch["loss_mask"][0]
        # each window starts with a conversation (never mid-way)
        assert ids[0] == start
        # targets are assistant text only: decoding them shows no user/system/header text
        target_text = tok.decode(labels[lm])
        assert "<|im_start|>" not in target_text and "detailed thinking" not in target_text
        n_targets += int(lm.sum())
    assert n_targets == m.counts["n_loss_tokens"]
    with pytest.raises(ValueError, match="packed whole into windows of 256"):
        ShardReader(tmp_path / "sft", global_batch_size=1, seq_len=128)
    # deterministic: the same config writes the same bytes
    m2 = materialize_sft(cfg, tmp_path / "sft2", progress=lambda s: None)
    assert m2.set_digest == m.set_digest
    # a conversation longer than seq_len is quarantined with a reason
    cfg_small = cfg.model_copy(update={"seq_len": 120})
    m3 = materialize_sft(cfg_small, tmp_path / "sft3", progress=lambda s: None)
    assert m3.counts["quarantined"].get("longer than seq_len", 0) > 0


def test_reads_parquet_exports(tmp_path, tokenizer_json):
    import pyarrow as pa
    import pyarrow.parquet as pq
    msg = pa.struct([("role", pa.string()), ("content", pa.string())])
    recs = _records()[:10]
    table = pa.table({"id": [r["id"] for r in recs],
                      "messages": pa.array([r["messages"] for r in recs], type=pa.list_(msg))})
    pq.write_table(table, tmp_path / "train.parquet")
    cfg = SftConfig(tokenizer={"kind": "hf", "path": str(tokenizer_json)}, seq_len=128, inputs=[str(tmp_path)])
    m = materialize_sft(cfg, tmp_path / "out", progress=lambda s: None)
    assert m.counts["n_conversations"] == 10
