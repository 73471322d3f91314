import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from purokit import atomic
from purokit.component import Component, finalize_component
from purokit.config import load_config
from purokit.document import BASE_SCHEMA, schema_problems
from purokit.errors import ContractError
from purokit.hashing import config_hash, fingerprint
from purokit.manifest import RunManifest, find_complete, fingerprints
from pydantic import BaseModel


def _docs(n, source="web"):
    return pa.table(
        {
            "id": [f"{source}-{i}" for i in range(n)],
            "text": [f"document {i}" for i in range(n)],
            "source": [source] * n,
            "meta": pa.array([[("k", str(i))] for i in range(n)], type=pa.map_(pa.string(), pa.string())),
            "quality.demo": pa.array([i / n for i in range(n)], type=pa.float64()),
            "filter.gopher": pa.array([i % 2 == 0 for i in range(n)]),
            "filter.gopher.reason": pa.array([None if i % 2 == 0 else "too_short" for i in range(n)], type=pa.string()),
        }
    )


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "out.json"
    atomic.write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_clean_stale_tmp_removes_debris(tmp_path):
    (tmp_path / ".tmp-x.123").write_text("partial")
    (tmp_path / "keep.txt").write_text("ok")
    removed = atomic.clean_stale_tmp(tmp_path)
    assert [p.name for p in removed] == [".tmp-x.123"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_config_hash_ignores_key_order():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_fingerprint_changes_with_content(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("one")
    a = fingerprint(f)["digest"]
    f.write_text("two")
    assert fingerprint(f)["digest"] != a


def test_schema_problems_name_the_column():
    assert schema_problems(_docs(3).schema) == []
    bad = _docs(3).set_column(4, "quality.demo", pa.array(["x"] * 3))
    assert any("quality.demo" in p for p in schema_problems(bad.schema))
    assert any("missing required column 'text'" in p for p in schema_problems(pa.schema([("id", pa.string())])))
    assert schema_problems(BASE_SCHEMA) == []


def test_component_roundtrip_and_corruption_detected(tmp_path):
    tmp = tmp_path / ".tmp-web"
    tmp.mkdir()
    pq.write_table(_docs(10), tmp / "part-0.parquet")
    pq.write_table(_docs(5), tmp / "part-1.parquet")
    (tmp / "_SUCCESS").write_text("")
    final = tmp_path / "web"
    m = finalize_component(tmp, final, {"job": "test", "name": "web", "config": {"x": 1}})
    assert m.n_docs == 15 and len(m.files) == 2
    comp = Component.open(final, verify_hashes=True)
    assert comp.read(["id"]).num_rows == 15
    comp.require_column("quality.demo")
    with pytest.raises(ContractError, match="no column 'quality.other'"):
        comp.require_column("quality.other")
    # flip one byte: hash verification catches it
    p = final / "part-0.parquet"
    data = bytearray(p.read_bytes())
    data[100] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(ContractError, match="sha256"):
        Component.open(final, verify_hashes=True)
    # truncate: the size check catches it even without hashing
    p.write_bytes(bytes(data[:-10]))
    with pytest.raises(ContractError, match="truncated"):
        Component.open(final)


def test_manifest_validation_names_file_and_field(tmp_path):
    RunManifest(job="j", config={"a": 1}).write(tmp_path)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    raw["counts"] = "not a dict"
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError) as e:
        RunManifest.read(tmp_path)
    assert "manifest.json" in str(e.value) and "counts" in str(e.value)
    raw["schema"] = "run/99"
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="run/99"):
        RunManifest.read(tmp_path)


def test_find_complete_skips_only_same_config_and_inputs(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("data")
    out = tmp_path / "out"
    out.mkdir()
    inputs = fingerprints([src])
    RunManifest(job="j", config={"a": 1}, inputs=inputs).write(out)
    assert find_complete(out, RunManifest, {"a": 1}, inputs) is not None
    assert find_complete(out, RunManifest, {"a": 2}, inputs) is None
    src.write_text("changed")
    assert find_complete(out, RunManifest, {"a": 1}, fingerprints([src])) is None


def test_load_config_overrides_and_errors(tmp_path):
    class Sub(BaseModel):
        n: int = 1

    class Cfg(BaseModel):
        name: str
        sub: Sub = Sub()

    p = tmp_path / "c.yaml"
    p.write_text("name: x\nsub:\n  n: 2\n")
    cfg = load_config(Cfg, p, ["sub.n=5"])
    assert cfg.sub.n == 5 and cfg.name == "x"
    with pytest.raises(ContractError, match="sub.n"):
        load_config(Cfg, p, ["sub.n=notanint"])


def test_overrides_index_lists():
    from purokit.config import apply_overrides

    data = {"steps": [{"kind": "a", "n": 1}, {"kind": "b", "n": 2}]}
    apply_overrides(data, ["steps.1.n=8", "new.key=[1, 2]"])
    assert data["steps"][1]["n"] == 8 and data["new"]["key"] == [1, 2]
    with pytest.raises(ValueError, match="not an index"):
        apply_overrides(data, ["steps.5.n=1"])


def test_repeated_names_every_value_seen_twice_sorted_once():
    from purokit.config import repeated

    assert repeated(["b", "a", "c", "b", "a", "b"]) == ["a", "b"]
    assert repeated(x for x in ("web", "code")) == []


def test_run_config_names_the_repeated_source():
    from kaiyuan.config import RunConfig

    with pytest.raises(ValueError, match=r"source names must be unique, repeated: \['web'\]"):
        RunConfig.model_validate({"output": "out", "sources": [{"name": n, "paths": ["x.jsonl"]} for n in ("web", "code", "web")]})
