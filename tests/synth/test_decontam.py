"""n-gram decontamination, duplicates, empty conversations; the report; idempotence."""

from __future__ import annotations

import json

from synth.decontam import EvalIndex, build_eval_index, clean_records, removal_summary
from purokit.records import Message, SynthRecord

EVAL_Q = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
          "How many clips did Natalia sell altogether in April and May?")


def rec(i: int, user: str, assistant: str = "answer", pair: str | None = None) -> SynthRecord:
    return SynthRecord(id=f"r{i}", generator="g", prompt_id=f"p{i}", pair_id=pair, pair_role="on" if pair else None,
                       messages=[Message(role="user", content=user), Message(role="assistant", content=assistant)])


def test_13gram_overlap_is_found_through_case_and_punctuation():
    idx = EvalIndex(n=13)
    idx.add("gsm8k", "7", EVAL_Q)
    copied = "Consider this: natalia SOLD clips to 48 of her friends in April -- and then she sold half as many!"
    hit = idx.find(copied)
    assert hit is not None and hit[0] == "gsm8k" and hit[1] == "7" and len(hit[2].split()) == 13
    assert idx.find("Natalia sold clips to 48 of her friends in April, then some more in June.") is None   # 12-gram only


def test_short_eval_items_match_whole():
    idx = EvalIndex(n=13)
    idx.add("tiny", "0", "What is 17 times 23?")
    assert idx.find("Quick: what is 17 times 23? Show work.") is not None
    assert idx.find("What is 17 times 24?") is None


def test_clean_reports_each_removal_and_is_idempotent(tmp_path):
    ev = tmp_path / "gsm8k_test.jsonl"
    ev.write_text(json.dumps({"question": EVAL_Q, "answer": "72"}) + "\n")
    idx = build_eval_index([{"name": "gsm8k", "path": str(ev), "fields": ["question"]}])
    records = [rec(0, "How many apples?"), rec(1, "How many apples?"),          # exact duplicate
               rec(2, "  How   many apples? "),                                # duplicate after whitespace
               rec(3, "", "x"),                                                # empty
               rec(4, EVAL_Q),                                                 # contaminated
               rec(5, "Something else entirely")]
    kept, removals = clean_records(records, idx)
    assert [r.id for r in kept] == ["r0", "r5"]
    by_id = {r["id"]: r for r in removals}
    assert by_id["r1"]["reason"] == "exact_duplicate" and by_id["r1"]["duplicate_of"] == "r0"
    assert by_id["r2"]["reason"] == "exact_duplicate"
    assert by_id["r3"]["reason"] == "empty_conversation"
    assert by_id["r4"]["reason"] == "ngram_overlap" and by_id["r4"]["benchmark"] == "gsm8k"
    assert removal_summary(removals) == {"empty_conversation": 1, "exact_duplicate": 2, "ngram_overlap:gsm8k": 1}
    again, removed_again = clean_records(kept, idx)
    assert [r.id for r in again] == ["r0", "r5"] and removed_again == []


def test_eval_sets_load_from_a_datasets_directory_and_parquet(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    datasets.DatasetDict({"test": datasets.Dataset.from_list([{"q": EVAL_Q, "uid": "g7"}])}).save_to_disk(str(tmp_path / "ds"))
    pq.write_table(pa.table({"question": ["What is 17 times 23?"]}), tmp_path / "e.parquet")
    idx = build_eval_index([{"name": "gsm", "path": str(tmp_path / "ds"), "fields": ["q"], "id_field": "uid"},
                            {"name": "pq", "path": str(tmp_path / "e.parquet")}])
    assert idx.find(EVAL_Q)[:2] == ("gsm", "g7")
    assert idx.find("so what is 17 times 23?")[0] == "pq"
    assert idx.n_examples == {"gsm": 1, "pq": 1}
