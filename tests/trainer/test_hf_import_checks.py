"""Hugging Face import against bad directories: every malformed file, contradicting config and
unsupported feature is refused before loading, naming the file and the field or tensor (one line,
exit 2 from the CLI); what a user may knowingly drop is imported with `accept`; an import is keyed
by its source's content, so a replaced directory is imported again."""

import json
import shutil
import struct
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from purokit.errors import ContractError
from trainer import checkpoint as ckpt
from trainer.config import load_run_config
from trainer.export import hf_tensor_shapes
from trainer.hf import import_hf
from trainer.model import ModelConfig
from trainer.train import resolve_start

CONFIG = {"model_type": "qwen3", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
          "max_position_embeddings": 64, "tie_word_embeddings": True,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
MODEL = ModelConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24,
                    max_seq_len=64)


def write_model(directory, seed=0, config=None, drop=("lm_head.weight",), **edit):
    """A tiny Qwen3 directory: config.json (CONFIG with `edit`) and model.safetensors (tied: no lm_head)."""
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    weights = {k: torch.randn(s, generator=g) for k, s in hf_tensor_shapes(MODEL).items() if k not in drop}
    save_file(weights, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config or {**CONFIG, **edit}))
    return directory


def rewrite_header(file, mutate):
    """The safetensors file with its JSON header changed by `mutate(header)` (the data unchanged)."""
    raw = file.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    mutate(header)
    new = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


@pytest.fixture
def model_dir(tmp_path):
    return write_model(tmp_path / "hf")


def refused(directory, out, match, **kw):
    with pytest.raises(ContractError, match=match) as e:
        import_hf(directory, out, **kw)
    return str(e.value)


def test_truncated_empty_and_oversized_headers_name_the_file(model_dir, tmp_path):
    f = model_dir / "model.safetensors"
    whole = f.read_bytes()
    f.write_bytes(whole[: len(whole) // 2])
    assert "model.safetensors" in refused(model_dir, tmp_path / "o", "data_offsets.*truncated|truncated")
    f.write_bytes(whole[:5])
    refused(model_dir, tmp_path / "o", r"model\.safetensors: truncated: 5 bytes")
    f.write_bytes(struct.pack("<Q", 0) + whole[8:])
    refused(model_dir, tmp_path / "o", r"model\.safetensors: empty safetensors header")
    f.write_bytes(struct.pack("<Q", 1 << 40) + whole[8:])
    refused(model_dir, tmp_path / "o", r"model\.safetensors: header length 1099511627776 is over")
    f.write_bytes(struct.pack("<Q", 50) + b"{" * 50 + whole[8:])
    refused(model_dir, tmp_path / "o", r"model\.safetensors: the safetensors header is not valid JSON")


def test_bad_offsets_are_named_by_tensor(model_dir, tmp_path):
    f = model_dir / "model.safetensors"
    rewrite_header(f, lambda h: h["model.norm.weight"].update(data_offsets=[0, 10**9]))
    refused(model_dir, tmp_path / "o", r"model\.safetensors: field 'data_offsets': tensor 'model.norm.weight'")
    write_model(model_dir)
    rewrite_header(f, lambda h: h["model.norm.weight"].update(data_offsets=[0, 64]))     # overlaps another tensor
    refused(model_dir, tmp_path / "o", "overlap")


def test_invalid_config_index_and_missing_fields(model_dir, tmp_path):
    (model_dir / "config.json").write_text("{not json")
    refused(model_dir, tmp_path / "o", r"config\.json: not valid JSON")
    write_model(model_dir, config={k: v for k, v in CONFIG.items() if k != "hidden_size"})
    refused(model_dir, tmp_path / "o", r"config\.json: field 'hidden_size': missing")
    write_model(model_dir, hidden_size="16")
    refused(model_dir, tmp_path / "o", r"field 'hidden_size': must be a positive integer")
    write_model(model_dir, tie_word_embeddings="false")
    refused(model_dir, tmp_path / "o", r"field 'tie_word_embeddings': must be true or false")
    write_model(model_dir, rope_theta="1e6")
    refused(model_dir, tmp_path / "o", r"field 'rope_theta': must be a number")
    write_model(model_dir, num_key_value_heads=3)
    refused(model_dir, tmp_path / "o", r"config\.json: not a model the trainer builds .*multiple of n_kv_heads")
    write_model(model_dir)
    (model_dir / "model.safetensors.index.json").write_text('{"weight_map": ')
    refused(model_dir, tmp_path / "o", r"model\.safetensors\.index\.json: not valid JSON")
    (model_dir / "model.safetensors.index.json").write_text('{"weight_map": {"model.norm.weight": "gone.safetensors"}}')
    refused(model_dir, tmp_path / "o", r"gone\.safetensors: field 'weight_map': listed in")
    (model_dir / "model.safetensors.index.json").write_text('{"weight_map": {"model.norm.weight": "../x"}}')
    refused(model_dir, tmp_path / "o", "not a file of this directory")


def test_a_dataset_directory_is_not_a_model(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(str(tmp_path / "ds"))
    refused(tmp_path / "ds", tmp_path / "o", "is a datasets directory, not a model")
    refused(tmp_path / "nowhere", tmp_path / "o", "not found or not a directory")


def test_config_contradicting_the_shapes_names_the_field(tmp_path):
    for field, value in [("hidden_size", 32), ("vocab_size", 41), ("intermediate_size", 20),
                         ("num_hidden_layers", 3), ("num_key_value_heads", 2)]:
        d = write_model(tmp_path / field, **{field: value})
        refused(d, tmp_path / "o", rf"config\.json: field '{field}'")


def test_unsupported_features_refused_by_name_unless_accepted(tmp_path):
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    d = write_model(tmp_path / "yarn", rope_scaling=yarn)       # rope_parameters still say default
    refused(d, tmp_path / "o1", r"field 'rope_scaling': rope type 'yarn' is not supported")
    assert ckpt.read_state(import_hf(d, tmp_path / "o1", accept=["rope_scaling"])).model["rope_theta"] == 10000.0
    d = write_model(tmp_path / "sw", use_sliding_window=True, sliding_window=16)
    refused(d, tmp_path / "o2", "sliding-window attention is not supported")
    import_hf(d, tmp_path / "o2", accept=["sliding_window"])
    d = write_model(tmp_path / "lt", layer_types=["full_attention", "sliding_attention"])
    refused(d, tmp_path / "o3", "sliding-window")
    with pytest.raises(ContractError, match="unknown"):
        import_hf(d, tmp_path / "o3", accept=["everything"])


def test_tiedness_the_weights_contradict(tmp_path):
    d = write_model(tmp_path / "a", drop=())                      # tied, but its own different lm_head
    refused(d, tmp_path / "o", r"field 'tie_word_embeddings': is true but lm_head\.weight differs")
    w = ckpt.load_weights(import_hf(d, tmp_path / "o", accept=["tie_word_embeddings"]))
    torch.testing.assert_close(w["lm_head.weight"], w["model.embed_tokens.weight"])
    d = write_model(tmp_path / "b", tie_word_embeddings=False)    # untied, but no lm_head
    refused(d, tmp_path / "o2", "is false but the weights have no lm_head.weight")


def test_nonfinite_weights_refused_naming_the_tensor(model_dir, tmp_path):
    from safetensors.torch import load_file
    f = model_dir / "model.safetensors"
    w = load_file(str(f))
    w["model.embed_tokens.weight"][7, 3] = float("nan")
    w["model.layers.1.mlp.up_proj.weight"][0, 0] = float("inf")
    save_file(w, str(f))
    msg = refused(model_dir, tmp_path / "o", "non-finite")
    assert "model.embed_tokens.weight: 1 values" in msg and "model.layers.1.mlp.up_proj.weight: 1 values" in msg
    got = ckpt.load_weights(import_hf(model_dir, tmp_path / "o", accept=["nonfinite"]))
    assert torch.isnan(got["model.embed_tokens.weight"][7, 3])


def test_changed_directory_is_imported_again(tmp_path):
    d = write_model(tmp_path / "hf", seed=0)
    first = ckpt.load_weights(import_hf(d, tmp_path / "o"))
    write_model(d, seed=1)                                          # same path, new weights
    second = ckpt.load_weights(import_hf(d, tmp_path / "o"))
    assert not torch.equal(first["model.norm.weight"], second["model.norm.weight"])
    assert torch.equal(second["model.norm.weight"], ckpt.load_weights(import_hf(d, tmp_path / "o"))["model.norm.weight"])


def test_init_from_hf_follows_a_replaced_directory(tmp_path):
    d = write_model(tmp_path / "hf", seed=0)
    run = tmp_path / "run"
    cfg = load_run_config(None, data={"run_dir": str(run), "init_from": {"hf": str(d)},
                                      "data": {"synthetic": {"vocab_size": 40, "seq_len": 16}},
                                      "train": {"steps": 1, "global_batch": 2, "micro_batch": 2}})
    before = ckpt.load_weights(resolve_start(cfg, run / "checkpoints").directory)["model.norm.weight"]
    shutil.rmtree(d)
    write_model(d, seed=5)                                          # DIR replaced
    after = ckpt.load_weights(resolve_start(cfg, run / "checkpoints").directory)["model.norm.weight"]
    assert not torch.equal(before, after)


def test_vocab_multiple_must_be_positive(model_dir, tmp_path):
    for bad in (0, -64):
        refused(model_dir, tmp_path / "o", "vocab_multiple.*positive", vocab_multiple=bad)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trainer", "import-hf", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_cli_errors_are_one_line_exit_2(model_dir, tmp_path, capsys):
    from trainer.__main__ import main

    for bad in ("0", "-64"):
        with pytest.raises(SystemExit) as e:
            main(["import-hf", str(model_dir), "--out", str(tmp_path / "o"), "--vocab-multiple", bad])
        assert e.value.code == 2 and "--vocab-multiple: must be a positive integer" in capsys.readouterr().err
    f = model_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    out = _cli(model_dir, "--out", tmp_path / "o")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and str(f) in out.stderr
