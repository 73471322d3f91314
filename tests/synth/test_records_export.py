"""Contract 6 records: validation with errors that name file/line/field; export formats."""

from __future__ import annotations

import json

import pytest

from purokit.errors import ContractError
from synth.export import export_records, load_export, to_arrow
from purokit.records import Message, Rollout, SynthRecord, read_records, write_records


def sft(i: int, mode: str = "on", **kw) -> SynthRecord:
    sysmsg = f"detailed thinking {mode}"
    return SynthRecord(id=f"r{i}", generator="g", prompt_id=f"p{i}", reasoning=mode, system=sysmsg,
                       messages=[Message(role="system", content=sysmsg), Message(role="user", content=f"q{i}"),
                                 Message(role="assistant", content=f"a{i}")], **kw)


def test_toggle_literal_is_enforced():
    with pytest.raises(ValueError, match="exactly"):
        SynthRecord(id="x", generator="g", prompt_id="p", reasoning="on", system="Detailed thinking on",
                    messages=[Message(role="system", content="Detailed thinking on")])
    with pytest.raises(ValueError, match="messages\\[0\\]"):
        SynthRecord(id="x", generator="g", prompt_id="p", reasoning="off", system="detailed thinking off",
                    messages=[Message(role="user", content="q")])


def test_rollout_alignment_and_logprob_sanity():
    Rollout(completion_token_ids=[1, 2], rollout_logprobs=[-0.1, 0.0])
    with pytest.raises(ValueError, match="2 rollout_logprobs for 3"):
        Rollout(completion_token_ids=[1, 2, 3], rollout_logprobs=[-0.1, -0.2])
    with pytest.raises(ValueError, match="finite"):
        Rollout(completion_token_ids=[1], rollout_logprobs=[0.5])


def test_reader_names_file_line_and_field(tmp_path):
    p = tmp_path / "r.jsonl"
    write_records(p, [sft(0), sft(1, "off")])
    assert [r.id for r in read_records(p)] == ["r0", "r1"]
    lines = p.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["pass_rate"] = 3.0
    p.write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ContractError) as ei:
        list(read_records(p))
    assert "line 2" in str(ei.value) and "r1" in str(ei.value)
    bad["schema"] = "synth-record/0"
    p.write_text(json.dumps(bad) + "\n")
    with pytest.raises(ContractError, match="field 'schema'"):
        list(read_records(p))


def test_export_jsonl_parquet_datasets_and_load(tmp_path):
    recs = [sft(0), sft(1, "off", pair_id="P", pair_role="off"),
            SynthRecord(id="rl0", kind="rl_prompt", generator="g", prompt_id="p9", prompt="2+2?", reference="4",
                        pass_rate=0.25, n_samples=8),
            SynthRecord(id="ro0", kind="rl_rollout", generator="g", prompt_id="p9", prompt="2+2?",
                        messages=[Message(role="user", content="2+2?"), Message(role="assistant", content="4")],
                        reward=1.0, rollout=Rollout(completion_token_ids=[7, 8], rollout_logprobs=[-0.5, -0.25],
                                                    truncated=False, finish_reason="stop"))]
    m = export_records(recs, tmp_path / "ex")
    assert m["splits"] == {"rl_prompts": 1, "rl_rollouts": 1, "train": 2}
    dd = load_export(tmp_path / "ex")
    train = dd["train"]
    assert train[0]["messages"][0] == {"role": "system", "content": "detailed thinking on", "tool_calls": None,
                                       "tool_call_id": None, "name": None}
    assert dd["rl_rollouts"][0]["rollout"]["completion_token_ids"] == [7, 8]
    import pyarrow.parquet as pq
    assert pq.read_table(tmp_path / "ex" / "train.parquet").schema.equals(to_arrow(recs[:2]).schema)
    (tmp_path / "ex" / "export_manifest.json").write_text(json.dumps({"schema": "synth-export/0"}))
    with pytest.raises(ContractError, match="schema"):
        load_export(tmp_path / "ex")


def test_an_export_with_nothing_accepted_is_an_empty_train_split(tmp_path):
    m = export_records([], tmp_path / "ex")
    assert m["splits"] == {"train": 0}
    dd = load_export(tmp_path / "ex")
    assert len(dd["train"]) == 0 and "messages" in dd["train"].column_names
    assert (tmp_path / "ex" / "train.jsonl").read_text() == ""


# ---- tool definitions (synth-record/2) -------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def tool_record(i: int = 0, tools=None) -> SynthRecord:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    return SynthRecord(id=f"t{i}", generator="tool_use", prompt_id=f"p{i}", category="tool_calling",
                       tools=[WEATHER] if tools is None else tools,
                       messages=[Message(role="user", content="Weather in Oslo?"),
                                 Message(role="assistant", content=None, tool_calls=[call]),
                                 Message(role="tool", tool_call_id="call_1", content='{"temp_c": 3}'),
                                 Message(role="assistant", content="3 C in Oslo.")])


def test_tools_field_is_validated_and_kept_verbatim(tmp_path):
    rec = tool_record()
    assert rec.schema_ == "synth-record/2" and rec.tools == [WEATHER]
    p = tmp_path / "r.jsonl"
    write_records(p, [rec, sft(1)])
    back = list(read_records(p))
    assert back[0].tools == [WEATHER] and back[1].tools is None
    assert json.loads(p.read_text().splitlines()[0])["tools"] == [WEATHER]      # no fields added to a definition
    for bad, why in (([{"type": "function"}], "expected"), ([{"type": "function", "function": {"name": ""}}], "name"),
                     ([dict(WEATHER, extra=1)], "unknown keys"), ([WEATHER, WEATHER], "duplicate"),
                     ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], "JSON schema object")):
        with pytest.raises(ValueError, match=why):
            tool_record(tools=bad)
    line = json.loads(p.read_text().splitlines()[0])
    line["tools"] = [{"type": "function", "function": {"name": "f", "params": {}}}]
    p.write_text(json.dumps(line) + "\n")
    with pytest.raises(ContractError) as ei:
        list(read_records(p))
    assert "line 1" in str(ei.value) and "t0" in str(ei.value) and "tools" in str(ei.value)


def test_version_1_records_and_exports_are_still_read(tmp_path):
    v2 = json.loads(sft(0).to_json_line())
    v1 = {k: v for k, v in v2.items() if k != "tools"}
    v1["schema"] = "synth-record/1"
    p = tmp_path / "old.jsonl"
    p.write_text(json.dumps(v1) + "\n")
    (rec,) = read_records(p)
    assert rec.schema_ == "synth-record/2" and rec.tools is None and rec.messages[1].content == "q0"
    p.write_text(json.dumps(dict(v1, tools=[WEATHER])) + "\n")       # /1 had no tools field
    with pytest.raises(ContractError, match="tools"):
        list(read_records(p))
    # an export written before tools: the same columns without `tools`, record_schema /1
    export_records([sft(0), sft(1, "off")], tmp_path / "ex")
    man = json.loads((tmp_path / "ex" / "export_manifest.json").read_text())
    import datasets
    dd = datasets.load_from_disk(str(tmp_path / "ex" / "dataset"))
    datasets.DatasetDict({"train": dd["train"].remove_columns(["tools"])}).save_to_disk(str(tmp_path / "old" / "dataset"))
    man["record_schema"] = "synth-record/1"
    (tmp_path / "old" / "export_manifest.json").write_text(json.dumps(man))
    old = load_export(tmp_path / "old")
    assert "tools" not in old["train"].column_names and len(old["train"]) == 2
    man["record_schema"] = "synth-record/2"
    (tmp_path / "old" / "export_manifest.json").write_text(json.dumps(man))
    with pytest.raises(ContractError, match="missing \\['tools'\\]"):
        load_export(tmp_path / "old")


def test_export_carries_tools_as_json_text(tmp_path):
    export_records([tool_record(), sft(1)], tmp_path / "ex")
    train = load_export(tmp_path / "ex")["train"]
    assert json.loads(train[0]["tools"]) == [WEATHER] and train[1]["tools"] is None
    assert train[0]["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    import pyarrow.parquet as pq
    rows = pq.read_table(tmp_path / "ex" / "train.parquet").to_pylist()
    assert json.loads(rows[0]["tools"]) == [WEATHER]
