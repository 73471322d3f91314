"""Issue 21 (spec): a duplicate YAML key is refused with both line numbers (in every config and
spec, through purokit.config.load_yaml); a bucket_count the documents cannot fill is refused with
the numbers, before any work."""

import pytest
import yaml

from purokit.errors import ContractError
from mixtures.spec import MIN_DOCS_PER_BUCKET, MixtureSpecError, bucket_count_problem, check_components, load_spec, parse_spec
from trainer.config import load_run_config

from .test_materialize import spec_dict


def test_duplicate_key_in_a_mixture_spec_names_both_lines(components, tokenizer_json, tmp_path):
    text = yaml.safe_dump(spec_dict(components, tokenizer_json), sort_keys=False)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("bucket_count:"))
    lines.append("bucket_count: 4")                          # a second one, at the end
    (tmp_path / "mix.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(ContractError, match=rf"mix.yaml: field 'bucket_count': duplicate key 'bucket_count' "
                                            rf"at lines {at + 1} and {len(lines)}"):
        load_spec(tmp_path / "mix.yaml")


def test_duplicate_nested_key_in_a_trainer_config(tmp_path):
    (tmp_path / "run.yaml").write_text("run_dir: r\ntrain:\n  steps: 3\n  global_batch: 8\n  steps: 5\n"
                                       "data: {synthetic: {}}\n")
    with pytest.raises(ContractError, match="duplicate key 'steps' at lines 3 and 5"):
        load_run_config(tmp_path / "run.yaml")


def test_keys_repeated_in_different_mappings_are_fine(tmp_path):
    from purokit.config import load_yaml

    (tmp_path / "ok.yaml").write_text("a: {name: x}\nb: {name: y}\nbase: &b {k: 1}\nc:\n  <<: *b\n  j: 2\n")
    assert load_yaml(tmp_path / "ok.yaml")["c"] == {"k": 1, "j": 2}


def test_bucket_count_larger_than_the_documents_is_refused_with_the_numbers(components, tokenizer_json):
    n_docs = 1200 + 500 + 400                               # web + math + code in the fixture
    spec = parse_spec(spec_dict(components, tokenizer_json, bucket_count=100_000))
    with pytest.raises(MixtureSpecError, match=rf"phase 'p1': bucket_count 100000 needs at least 200000 "
                                               rf"documents .* hold {n_docs}; use bucket_count <= {n_docs // 2}") as e:
        check_components(spec, "mix.yaml")
    assert e.value.field == "bucket_count"
    d = spec_dict(components, tokenizer_json)
    d["phases"][1]["bucket_count"] = 5000
    with pytest.raises(MixtureSpecError) as e:
        check_components(parse_spec(d), "mix.yaml")
    assert e.value.field == "phases[1].bucket_count" and "phase 'p2'" in str(e.value)
    check_components(parse_spec(spec_dict(components, tokenizer_json, bucket_count=n_docs // 2)))


def test_bucket_count_problem_bounds():
    assert bucket_count_problem(1, 0) is None
    assert bucket_count_problem(376, 376 * MIN_DOCS_PER_BUCKET) is None
    assert "needs at least 754" in bucket_count_problem(377, 739)
