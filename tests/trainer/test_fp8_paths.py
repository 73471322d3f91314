"""Which path each FP8 GEMM takes, and why (trainer.fp8.paths, trainer.fp8.gemm.pick_gemm): the choice against
the committed measured table, the one line or table the trainer prints at start, and that it does print it."""

from __future__ import annotations

import pytest
import torch

from trainer.fp8 import convert_to_fp8, cutlass_gemm, gemm
from trainer.fp8.gemm import CUBLAS, GemmChoice, pick_gemm
from trainer.fp8.paths import describe_gemm_paths, emulation_reason, gemm_paths, gemm_shapes, kernel_shapes
from trainer.model import build_model, preset_config

H200 = "NVIDIA H200"
CUTLASS_ONLY = ["coop_128x128_c1x1", "coop_256x128_c1x1", "coop_256x128_c2x1", "coop_128x128_c2x1"]
USABLE = (True, "loaded .gpu_build/libpurokit_fp8_gemm.so")


def test_pick_gemm_follows_the_measured_table_and_says_why():
    # the committed table: cuBLAS measured faster for the 1.7B qkv Fprop, a CUTLASS config for the down Fprop
    assert pick_gemm("fprop", 32768, 4096, 2048, "auto", USABLE, H200, CUTLASS_ONLY) == (
        CUBLAS, f"measured faster than the library on {H200} (gemm_table.json)")
    choice, why = pick_gemm("fprop", 32768, 2048, 6144, "auto", USABLE, H200, CUTLASS_ONLY)
    assert choice == GemmChoice("cutlass", "coop_256x128_c1x1")
    assert why == f"measured fastest on {H200} (gemm_table.json)"
    # a DeepGEMM config the build lacks: cuBLAS, and what to set to get it; with it built, the library
    choice, why = pick_gemm("fprop", 32768, 2048, 2048, "auto", USABLE, H200, CUTLASS_ONLY)
    assert choice == CUBLAS and "deepgemm_256x128_c1x1_n2048_k2048 is not in this library build" in why
    assert "DEEPGEMM_DIR" in why
    with_dg = CUTLASS_ONLY + ["deepgemm_256x128_c1x1_n2048_k2048"]
    assert pick_gemm("fprop", 32768, 2048, 2048, "auto", USABLE, H200, with_dg)[0].config == with_dg[-1]
    # another GPU: no row; a recipe forcing the library takes its first config that runs the shape
    assert pick_gemm("wgrad", 2048, 2048, 32768, "auto", USABLE, "GPU Z", CUTLASS_ONLY) == (
        CUBLAS, "gemm_table.json has no GPU Z row for this shape")
    choice, why = pick_gemm("wgrad", 2048, 2048, 32768, "cutlass", USABLE, "GPU Z", CUTLASS_ONLY)
    assert choice == GemmChoice("cutlass", CUTLASS_ONLY[0]) and why.startswith("the recipe's gemm is cutlass")


def test_pick_gemm_without_the_library_names_what_to_build():
    missing = (False, "no libpurokit_fp8_gemm.so at X: build it with `make fp8-gemm-lib`")
    assert pick_gemm("fprop", 32768, 2048, 6144, "auto", missing, "", []) == (CUBLAS, missing[1])
    assert pick_gemm("fprop", 32768, 2048, 6144, "cublas", USABLE, H200, CUTLASS_ONLY) == (
        CUBLAS, "the recipe's gemm is cublas")
    with pytest.raises(RuntimeError, match="'cutlass' is not usable here: no libpurokit"):
        pick_gemm("fprop", 32768, 2048, 6144, "cutlass", missing, "", [])


def test_emulation_reason_is_the_backend_rule():
    caps = gemm.ScaledMmCaps(True, "ok")
    assert emulation_reason("auto", True, 4096, 2048, caps) is None
    assert emulation_reason("emulate", True, 4096, 2048, caps) == "the recipe's backend is emulate"
    assert emulation_reason("auto", False, 4096, 2048, caps) == "no CUDA device"
    assert emulation_reason("auto", True, 192, 64, caps) == "in/out features not multiples of 128"
    assert "torch too old" in emulation_reason("auto", True, 4096, 2048, gemm.ScaledMmCaps(False, "torch too old"))


def test_kernel_shapes_are_what_the_gemm_ops_ask_the_table_for():
    # Fprop (tokens, N, K); Dgrad by the transposed weight (tokens, K, N); Wgrad over the padded tokens
    assert kernel_shapes(32768, 4096, 2048) == {
        "fprop": (32768, 4096, 2048), "dgrad": (32768, 2048, 4096), "wgrad": (4096, 2048, 32768)}
    assert kernel_shapes(1000, 256, 128)["wgrad"] == (256, 128, 1024)


@pytest.fixture(scope="module")
def fp8_17b():
    """Two blocks of the 1.7B preset (its GEMM shapes) on the meta device, converted to FP8."""
    return convert_to_fp8(build_model(preset_config("1.7b", vocab_size=256, n_layers=2), device="meta"))


def test_the_17b_gemms_are_its_four_stacked_weights(fp8_17b):
    assert gemm_shapes(fp8_17b) == [("q_proj+k_proj+v_proj", 4096, 2048), ("o_proj", 2048, 2048),
                                    ("gate_proj+up_proj", 12288, 2048), ("down_proj", 2048, 6144)]


def test_one_line_where_every_gemm_takes_one_path(fp8_17b, monkeypatch):
    text = describe_gemm_paths(fp8_17b, None, 32768, torch.device("cpu"))
    assert text == ("[fp8] GEMM paths at 32,768 tokens a micro-batch: all 12 (4 weight shapes x fprop/dgrad/wgrad) "
                    "on emulation: no CUDA device")
    # a CUDA device without the library: cuBLAS, and the build command, in one line
    monkeypatch.setattr(gemm, "probe_scaled_mm", lambda device: gemm.ScaledMmCaps(True, "ok"))
    monkeypatch.setattr(cutlass_gemm, "available", lambda device=None: (False, "no lib: `make fp8-gemm-lib`"))
    text = describe_gemm_paths(fp8_17b, None, 32768, torch.device("cuda", 0))
    assert text.count("\n") == 0 and text.endswith("on cuBLAS: no lib: `make fp8-gemm-lib`")


def test_a_line_a_gemm_where_paths_differ(fp8_17b, monkeypatch):
    monkeypatch.setattr(gemm, "probe_scaled_mm", lambda device: gemm.ScaledMmCaps(True, "ok"))
    monkeypatch.setattr(cutlass_gemm, "available", lambda device=None: USABLE)
    monkeypatch.setattr(cutlass_gemm, "configs", lambda kind, n=None, k=None: CUTLASS_ONLY)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: H200)
    rows = gemm_paths(fp8_17b, None, 32768, torch.device("cuda", 0))
    assert len(rows) == 12
    paths = {(r.linears, r.role): r.path for r in rows}
    assert paths[("down_proj", "fprop")] == "library coop_256x128_c1x1"
    assert paths[("q_proj+k_proj+v_proj", "fprop")] == "cuBLAS"
    assert all(p.startswith("library") for (_, role), p in paths.items() if role == "wgrad")
    # a build without DeepGEMM: the table's DeepGEMM choices (6 of the 12) run on cuBLAS, and say so
    assert sum("DEEPGEMM_DIR" in r.why and r.path == "cuBLAS" for r in rows) == 6
    lines = describe_gemm_paths(fp8_17b, None, 32768, torch.device("cuda", 0)).splitlines()
    assert len(lines) == 13 and lines[0].endswith("(M x N x K):")
    assert "down_proj" in lines[10] and "32768x2048x6144" in lines[10] and "library coop_256x128_c1x1" in lines[10]


def test_the_trainer_says_at_start_which_path_its_gemms_take(tmp_path, capsys):
    from trainer.config import load_run_config
    from trainer.train import train

    train(load_run_config(None, data={
        "run_dir": str(tmp_path / "run"), "precision": "fp8-blockwise", "compile": False,
        "model": {"preset": "tiny"}, "data": {"synthetic": {"vocab_size": 256, "seq_len": 64}},
        "train": {"steps": 1, "global_batch": 2, "micro_batch": 2},
        "checkpoint": {"every_steps": 0, "at_end": False}, "eval": {"at_end": False}, "log": {"progress": "line"}}))
    out = capsys.readouterr().out
    assert ("[fp8] GEMM paths at 128 tokens a micro-batch: all 12 (4 weight shapes x fprop/dgrad/wgrad) on "
            "emulation: no CUDA device") in out
