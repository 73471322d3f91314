"""Local materialization end to end on real components: specs, retention, shard sets, determinism."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pytest

from mixtures.materialize import materialize
from mixtures.reader import EvalReader, ShardReader
from mixtures.shards import ShardError, ShardManifest, ShardSet
from mixtures.spec import MixtureSpecError, check_components, load_spec, parse_spec
from mixtures.tokenizers import load_tokenizer

from .conftest import make_component


def spec_dict(components, tokenizer_json, **over):
    d = {
        "name": "test", "tokenizer": {"kind": "hf", "path": str(tokenizer_json)}, "seq_len": 32, "bucket_count": 6,
        "seeds": {"bucket_shuffle": 1, "uniform": 2, "replay": 3, "budget": 4, "holdout": 5},
        "holdout": {"fraction": 0.05},
        "components": [
            {"name": "web", "path": str(components["web"]), "score_field": "edu", "order_seed": 7},
            {"name": "math", "path": str(components["math"]), "score_field": "math", "higher_is_better": False},
            {"name": "code", "path": str(components["code"]), "order_seed": 9},
        ],
        "phases": [
            {"name": "p1", "components": {"web": 0.8, "math": 0.1, "code": 0.1}},
            {"name": "p2", "orders": ["curriculum", "uniform"], "transition_tokens": 12_000,
             "components": {"web": {}, "math": {}, "code": {}}},
        ],
    }
    d.update(over)
    return d


@pytest.fixture(scope="module")
def sets(tmp_path_factory, components, tokenizer_json):
    out = tmp_path_factory.mktemp("shards")
    spec = parse_spec(spec_dict(components, tokenizer_json))
    manifests = materialize(spec, out, progress=lambda m: None)
    return spec, out, manifests


def _index(path):
    ss = ShardSet.open(path)
    import pyarrow as pa
    return pa.concat_tables([ss.read_index(i) for i in range(len(ss.manifest.shards))]).to_pandas()


def test_sets_and_manifest_contents(sets, tokenizer_json):
    spec, out, manifests = sets
    assert sorted(manifests) == ["eval", "p1-uniform", "p2-curriculum", "p2-uniform"]
    m = ShardManifest.read(out / "p2-curriculum")
    tok = load_tokenizer(spec.tokenizer)
    assert m.tokenizer.digest == tok.identity.digest and m.tokenizer.files["tokenizer.json"]
    assert m.dtype == "uint16" and m.seq_len == 32 and m.spec_hash == spec.spec_hash()
    assert m.bucket_count == 6 and len(m.buckets) == 6
    assert {"seeds.bucket_shuffle", "seeds.uniform", "order_seed.web"} <= set(m.seeds)
    assert {c.name for c in m.components} == {"web", "math", "code"}
    assert all(len(c.manifest_sha256) == 64 for c in m.components)
    assert len(m.inputs) == 3 and all(i.path.endswith("manifest.json") for i in m.inputs)
    assert [s.name for s in m.segments][:2] == ["t0000", "b0001"] or m.segments[0].name == "t0000"
    assert (out / "p2-curriculum" / "run.json").is_file()
    # the manifest's per-bucket figures match the document indexes
    idx = _index(out / "p2-curriculum")
    body = idx[~idx.component.str.startswith("replay:")]
    for b in m.buckets:
        k = int(b.name[1:])
        got = body[body.bucket == k].groupby("component").n_tokens.sum().to_dict()
        assert got == b.tokens_by_component


def test_pool_conservation_curriculum_vs_uniform_1(sets):
    spec, out, _ = sets
    a, b = _index(out / "p2-curriculum"), _index(out / "p2-uniform")
    key = lambda d: sorted(zip(d.component, d.doc_id, d["copy"]))  # noqa: E731
    assert key(a) == key(b)
    assert a.n_tokens.sum() == b.n_tokens.sum()
    # nothing from the held-out eval set leaks into training
    ev = _index(out / "eval")
    assert not set(ev.doc_id) & (set(a.doc_id) | set(_index(out / "p1-uniform").doc_id))


def test_within_component_rank_monotonic_in_curriculum_stream_4(sets, components):
    spec, out, _ = sets
    idx = _index(out / "p2-curriculum")
    from purokit.component import Component
    for name, col, sign in (("web", "quality.edu", 1), ("math", "quality.math", -1)):
        scores = Component.open(components[name]).read(["id", col]).to_pandas().set_index("id")[col]
        d = idx[idx.component == name]
        key = sign * scores.loc[d.doc_id].to_numpy()
        for k in range(5):
            assert key[d.bucket.to_numpy() == k].max() <= key[d.bucket.to_numpy() == k + 1].min()
        # rank is the token mass before the document, in preference order
        d = d.assign(key=key).sort_values("rank")
        assert np.all(np.diff(d.key.to_numpy()) >= 0)


def test_curriculum_progress_and_uniform_flatness_9_10(sets):
    spec, out, _ = sets
    for name in ("p2-curriculum", "p2-uniform"):
        m = ShardManifest.read(out / name)
        body = [s for s in m.segments if s.name != "t0000"]
        means = [s.mean_rank_by_component["web"] for s in body]
        if name == "p2-curriculum":
            assert np.all(np.diff(means) > 0)
            # after the transition, segment b000k holds bucket k: mean rank ~ (k + 0.5) / K
            for s in body:
                k = int(s.name[1:])
                for c in ("web", "math", "code"):
                    assert abs(s.mean_rank_by_component[c] - (k + 0.5) / 6) < 0.03
        else:
            assert all(abs(x - 0.5) < 0.12 for x in means)


def test_rematerializing_is_byte_identical_and_reuses_complete_sets_8(sets, tmp_path, components, tokenizer_json):
    spec, out, _ = sets
    again = tmp_path / "again"
    materialize(parse_spec(spec_dict(components, tokenizer_json)), again, progress=lambda m: None)
    for set_name in ("p1-uniform", "p2-curriculum", "p2-uniform", "eval"):
        names = sorted(p.name for p in (out / set_name).iterdir() if p.name != "run.json")
        assert names == sorted(p.name for p in (again / set_name).iterdir() if p.name != "run.json")
        for n in names:
            assert (out / set_name / n).read_bytes() == (again / set_name / n).read_bytes(), (set_name, n)
    # a second run over the same output finds every set complete and writes nothing
    before = {p: p.stat().st_mtime_ns for p in (again / "p2-curriculum").iterdir()}
    notes = []
    materialize(parse_spec(spec_dict(components, tokenizer_json)), again, progress=notes.append)
    assert all("reused" in n for n in notes) and len(notes) == 4
    assert before == {p: p.stat().st_mtime_ns for p in (again / "p2-curriculum").iterdir()}
    # a different seed changes the stream
    other = spec_dict(components, tokenizer_json)
    other["seeds"]["bucket_shuffle"] = 99
    materialize(parse_spec(other), tmp_path / "other", sets=["p2-curriculum"], progress=lambda m: None)
    assert (tmp_path / "other" / "p2-curriculum" / "b0003-000.bin").read_bytes() != \
        (out / "p2-curriculum" / "b0003-000.bin").read_bytes()


def test_one_byte_corruption_is_detected(sets, tmp_path):
    spec, out, _ = sets
    copy = tmp_path / "c"
    shutil.copytree(out / "p2-uniform", copy)
    f = copy / "u0002-000.bin"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="u0002-000.bin"):
        ShardSet.open(copy, verify_hashes=True)


def test_the_reader_reads_materialized_sets_and_refuses_another_tokenizer(sets, tmp_path):
    spec, out, _ = sets
    tok = load_tokenizer(spec.tokenizer)
    r = ShardReader(out / "p2-curriculum", global_batch_size=4, tokenizer=tok)
    batch = next(r)
    text = tok.decode(batch["input_ids"][0])
    assert text.split()[0] in ("web", "math", "code") or "<|endoftext|>" in text
    ev = EvalReader(out / "eval", batch_size=2, tokenizer=tok)
    assert len(ev) >= 1
    from mixtures.tokenizers import train_bpe
    other = train_bpe(["completely different text " * 5] * 50, 300, tmp_path / "tok2")
    from mixtures.shards import TokenizerMismatch
    with pytest.raises(TokenizerMismatch):
        ShardReader(out / "p2-curriculum", global_batch_size=4, tokenizer=other)


def test_transition_in_materialized_set_13(sets):
    spec, out, _ = sets
    m = ShardManifest.read(out / "p2-curriculum")
    t = m.extra["transition"]
    assert t["from_phase"] == "p1" and t["transition_tokens"] == 12_000
    assert abs(t["replay_tokens"] - 6_000) < 200 and abs(t["phase_tokens"] - 6_000) < 200
    idx = _index(out / "p2-curriculum")
    replay = idx.component.str.startswith("replay:").to_numpy()
    pos = np.concatenate([[0], np.cumsum(idx.n_tokens.to_numpy())[:-1]])
    assert pos[replay].max() < 12_000
    # uniform and curriculum replay the same phase-1 documents
    u = _index(out / "p2-uniform")
    assert sorted(idx.doc_id[replay]) == sorted(u.doc_id[u.component.str.startswith("replay:")])


# ---- retention rules and budgets ----------------------------------------------------------------

def _one(components, tokenizer_json, tmp_path, component, phase_share=None, set_name="p-uniform", bucket_count=6,
         **phase):
    d = spec_dict(components, tokenizer_json, holdout=None, bucket_count=bucket_count)
    d["components"] = [dict(component, path=str(components[component.get("src", component["name"])]))]
    d["components"][0].pop("src", None)
    d["phases"] = [{"name": "p", "components": {component["name"]: phase_share or {}}, **phase}]
    spec = parse_spec(d)
    materialize(spec, tmp_path / "o", progress=lambda m: None)
    return _index(tmp_path / "o" / set_name)


def _scores(components, name, col):
    from purokit.component import Component
    return Component.open(components[name]).read(["id", col]).to_pandas().set_index("id")[col]


def test_retention_threshold(components, tokenizer_json, tmp_path):
    idx = _one(components, tokenizer_json, tmp_path, {"name": "web", "score_field": "edu",
                                                     "retention": {"rule": "threshold", "threshold": 0.7}})
    s = _scores(components, "web", "quality.edu")
    assert set(idx.doc_id) == set(s.index[s >= 0.7])


def test_retention_top_fraction_by_token_mass(components, tokenizer_json, tmp_path):
    idx = _one(components, tokenizer_json, tmp_path, {"name": "math", "score_field": "math", "higher_is_better": False,
                                                     "retention": {"rule": "top_fraction", "fraction": 0.25}})
    s = _scores(components, "math", "quality.math")
    kept = s.loc[list(idx.doc_id)]
    dropped = s.drop(index=list(idx.doc_id))
    assert kept.max() <= dropped.min()                       # lower is better: the lowest scores kept
    use = ShardManifest.read(tmp_path / "o" / "p-uniform").components[0]
    assert use.n_tokens_retained == idx.n_tokens.sum()
    from purokit.component import Component
    texts = Component.open(components["math"]).read(["text"]).column("text").to_pylist()
    _, lengths = load_tokenizer({"kind": "hf", "path": str(tokenizer_json)}).encode_flat(texts)
    assert abs(use.n_tokens_retained / lengths.sum() - 0.25) < 0.01       # a quarter of the token mass


def test_retention_quantile_band_and_random_tokens(components, tokenizer_json, tmp_path):
    idx = _one(components, tokenizer_json, tmp_path / "a", {"name": "web", "score_field": "edu",
                                                           "retention": {"rule": "quantile_band", "low": 0.25, "high": 0.5}})
    s = _scores(components, "web", "quality.edu").loc[list(idx.doc_id)]
    assert 0.2 < s.min() and s.max() < 0.55
    idx = _one(components, tokenizer_json, tmp_path / "b", {"name": "code", "retention": {"rule": "random_tokens",
                                                                                         "n_tokens": 3000, "seed": 1}})
    assert 3000 <= idx.n_tokens.sum() < 3000 + idx.n_tokens.max()


def test_repetition_uniform_and_budget_subsample(components, tokenizer_json, tmp_path):
    m = ShardManifest.read  # noqa: F841
    idx = _one(components, tokenizer_json, tmp_path / "a", {"name": "code", "repeat": "uniform"},
               phase_share={"n_tokens": 30_000})
    assert 30_000 <= idx.n_tokens.sum() < 30_000 + idx.n_tokens.max()
    assert idx["copy"].max() >= 1
    assert idx.groupby("doc_id").size().max() == idx["copy"].max() + 1
    idx = _one(components, tokenizer_json, tmp_path / "b", {"name": "code"}, phase_share={"n_tokens": 5_000})
    assert 5_000 <= idx.n_tokens.sum() < 5_000 + idx.n_tokens.max() and idx["copy"].max() == 0


def test_dup_count_aware_repetition(tmp_path, tokenizer_json):
    dup = pa.array([5 if i < 10 else 1 for i in range(100)], type=pa.int64())
    comp = make_component(tmp_path / "c", "dups", 100, seed=4, score=None, extra={"dup_count": dup})
    comps = {"dups": comp, "web": comp, "math": comp, "code": comp}
    idx = _one(comps, tokenizer_json, tmp_path, {"name": "dups", "repeat": "dup_count"},
               phase_share={"n_tokens": 4_000})
    copies = idx.groupby("doc_id").size()
    heavy = [f"dups-{i:06d}" for i in range(10)]
    assert copies.loc[heavy].mean() > copies.drop(index=heavy).mean()


def test_repetition_respects_dedup_and_spreads_copies_over_buckets(tmp_path, tokenizer_json):
    """A template with dup_count 5,000 takes at most max_copies; at 4x repetition every repeated
    document's copies land in more than one curriculum bucket (copy c is ranked within pass c)."""
    dup = pa.array([5000] + [4] * 99 + [1] * 100, type=pa.int64())
    comp = make_component(tmp_path / "c", "dups", 200, seed=6, extra={"dup_count": dup})
    comps = {"dups": comp, "web": comp, "math": comp, "code": comp}
    n = _one(comps, tokenizer_json, tmp_path / "all", {"name": "dups"}, bucket_count=1).set_index("doc_id").n_tokens
    total = int(n.sum())
    ids = [f"dups-{i:06d}" for i in range(200)]
    heavy, dup4, single = ids[:1], ids[1:100], ids[100:]
    for rule, cap, cap4 in (("dup_count", 3, 3), ("log_dup_count", 4, 3)):
        supply = total + (cap - 1) * int(n[heavy].sum()) + (cap4 - 1) * int(n[dup4].sum())
        d = {"name": "dups", "score_field": "edu", "repeat": rule, "max_copies": cap}
        idx = _one(comps, tokenizer_json, tmp_path / rule, d, phase_share={"n_tokens": supply},
                   orders=["curriculum"], set_name="p-curriculum")
        copies = idx.groupby("doc_id").size()
        assert copies[heavy[0]] == cap                       # dup_count 5,000 (log2: 13 copies), capped
        assert (copies[dup4] == cap4).all() and (copies[single] == 1).all()
        with pytest.raises(MixtureSpecError, match="capped repetition supplies at most"):
            _one(comps, tokenizer_json, tmp_path / f"{rule}-over", d, phase_share={"n_tokens": supply + 1})
    idx = _one(comps, tokenizer_json, tmp_path / "uniform", {"name": "dups", "score_field": "edu", "repeat": "uniform"},
               phase_share={"n_tokens": 4 * total}, orders=["curriculum"], set_name="p-curriculum")
    per_doc = idx.groupby("doc_id").agg(copies=("copy", "size"), buckets=("bucket", "nunique"))
    repeated = per_doc[per_doc.copies >= 4]
    assert len(repeated) > 150 and (repeated.buckets >= 2).all()


# ---- spec validation: bad specs fail before any work ---------------------------------------------

@pytest.mark.parametrize("mutate, field, message", [
    (lambda d: d["phases"][0]["components"].update({"nope": 0.0}), "phases[0].components.nope", "unknown component"),
    (lambda d: d["phases"][0]["components"].update({"web": 0.7}), "phases[0].components", "sum to 0.9"),
    (lambda d: d.update(bucket_count=0), "bucket_count", "greater than or equal to 1"),
    (lambda d: d["components"].append(dict(d["components"][0])), "components[3].name", "duplicate component name 'web'"),
    (lambda d: d["components"][2].update(retention={"rule": "top_fraction", "fraction": 0.5}), "components[2]",
     "needs a score_field"),
    (lambda d: d["components"][0].update(retention={"rule": "quantile_band", "low": 0.6, "high": 0.5}),
     "components[0].retention", "low (0.6) must be below high"),
    (lambda d: d["phases"][0].update(transition_tokens=100), "phases[0].transition_tokens", "no earlier phase"),
    (lambda d: d.update(seq_len="long"), "seq_len", "integer"),
])
def test_bad_specs_name_the_field(components, tokenizer_json, mutate, field, message):
    d = spec_dict(components, tokenizer_json)
    mutate(d)
    with pytest.raises(MixtureSpecError) as e:
        parse_spec(d, "mix.yaml")
    assert e.value.field is not None and e.value.field.startswith(field), (e.value.field, str(e.value))
    assert message in str(e.value) and "mix.yaml" in str(e.value)


def test_spec_checks_against_components(components, tokenizer_json, tmp_path):
    d = spec_dict(components, tokenizer_json)
    d["components"][0]["score_field"] = "fasttext_hq"
    with pytest.raises(MixtureSpecError, match=r"no such column \(columns: id, meta, quality.edu") as e:
        check_components(parse_spec(d), "mix.yaml")
    assert e.value.field == "components[0].score_field"
    d = spec_dict(components, tokenizer_json)
    d["components"][1]["path"] = str(tmp_path / "missing")
    with pytest.raises(MixtureSpecError, match="component 'math'"):
        check_components(parse_spec(d))


def test_budget_larger_than_data_without_repetition_fails_before_writing(components, tokenizer_json, tmp_path):
    d = spec_dict(components, tokenizer_json)
    d["phases"][0]["n_tokens"] = 10_000_000
    with pytest.raises(MixtureSpecError, match="repeat is 'none'") as e:
        materialize(parse_spec(d), tmp_path / "o", progress=lambda m: None)
    assert e.value.field == "phases[0].components"
    assert not [p for p in (tmp_path / "o").iterdir() if not p.name.startswith(".")]


def test_load_spec_resolves_relative_paths_and_overrides(components, tokenizer_json, tmp_path):
    import yaml
    d = spec_dict(components, tokenizer_json)
    (tmp_path / "comps").symlink_to(components["web"].parent)
    d["components"][0]["path"] = "comps/web"
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(d))
    spec = load_spec(tmp_path / "mix.yaml", overrides=["bucket_count=3", "seeds.uniform=11"])
    assert spec.bucket_count == 3 and spec.seeds.uniform == 11
    assert spec.components[0].path == str((tmp_path / "comps" / "web").resolve())
    assert json.loads(json.dumps(spec.to_yaml_dict()))["schema"] == "mixture/1"


def test_aliases_of_one_source_share_the_held_out_set(components, tokenizer_json, tmp_path):
    """Per-phase retention by declaring a source twice: phase 1 all of it, phase 2 its top half;
    held-out documents are the same for both names and never trained on."""
    d = spec_dict(components, tokenizer_json, holdout={"fraction": 0.1})
    d["components"] = [{"name": "web", "path": str(components["web"]), "score_field": "edu"},
                       {"name": "web_top", "path": str(components["web"]), "score_field": "edu",
                        "retention": {"rule": "top_fraction", "fraction": 0.5}}]
    d["phases"] = [{"name": "p1", "components": {"web": {}}},
                   {"name": "p2", "components": {"web_top": {}}}]
    materialize(parse_spec(d), tmp_path / "o", progress=lambda m: None)
    ev = _index(tmp_path / "o" / "eval")
    assert len(ev) == ev.doc_id.nunique() and set(ev.component) == {"web"}
    assert 80 < len(ev) < 160
    for name in ("p1-uniform", "p2-uniform"):
        assert not set(ev.doc_id) & set(_index(tmp_path / "o" / name).doc_id)


def test_a_killed_run_resumes_without_redoing_tokenization(components, tokenizer_json, tmp_path, monkeypatch):
    import mixtures.materialize as mm

    spec = parse_spec(spec_dict(components, tokenizer_json))
    real = mm.write_shard_file
    calls = {"n": 0}

    def dies_on_the_fifth_file(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt("killed")
        return real(*a, **kw)

    monkeypatch.setattr(mm, "write_shard_file", dies_on_the_fifth_file)
    with pytest.raises(KeyboardInterrupt):
        materialize(spec, tmp_path / "o", progress=lambda m: None)
    monkeypatch.setattr(mm, "write_shard_file", real)
    # nothing half-written is visible; the token spill survived
    assert not [p for p in (tmp_path / "o").iterdir() if not p.name.startswith(".")]
    spills = list((tmp_path / "o").glob(".work-*/*/done.json"))
    assert len(spills) == 3
    stamps = {p: p.stat().st_mtime_ns for p in spills}
    notes = []
    materialize(spec, tmp_path / "o", progress=notes.append, keep_work=True)
    assert not any(n.startswith("tokenized") for n in notes)        # the spill was reused
    assert {p: p.stat().st_mtime_ns for p in spills} == stamps
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if not p.name.startswith(".")) == \
        ["eval", "p1-uniform", "p2-curriculum", "p2-uniform"]
    ShardSet.open(tmp_path / "o" / "p2-uniform", verify_hashes=True)
