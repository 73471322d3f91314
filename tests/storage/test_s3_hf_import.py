"""`init_from: {hf: DIR}` with an s3 `run_dir`: the import is written to the run directory's store
(moto on loopback), not to a `./s3:` directory in the working directory, and is reused from there."""

from pathlib import Path

from purokit import storage
from tests.trainer.test_hf_import_checks import write_model
from trainer import checkpoint as ckpt
from trainer.config import load_run_config
from trainer.train import resolve_start


def test_init_from_hf_writes_the_import_to_the_s3_run_dir(bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = write_model(tmp_path / "hf")
    run_dir = f"{bucket}/run"
    cfg = load_run_config(None, data={"run_dir": run_dir, "init_from": {"hf": str(d)},
                                      "data": {"synthetic": {"vocab_size": 40, "seq_len": 16}},
                                      "train": {"steps": 1, "global_batch": 2, "micro_batch": 2}})
    start = resolve_start(cfg, f"{run_dir}/checkpoints")
    assert str(start.directory) == f"{run_dir}/init_hf/step_00000000"
    assert storage.has_committed(f"{run_dir}/init_hf/step_00000000", "state.json")
    assert not any(Path(tmp_path).glob("s3*"))
    assert ckpt.read_state(start.directory).model["vocab_size"] == 40
    record = storage.read_commit(start.directory)
    again = resolve_start(cfg, f"{run_dir}/checkpoints")          # the same source: reused, not rewritten
    assert str(again.directory) == str(start.directory) and storage.read_commit(again.directory) == record
