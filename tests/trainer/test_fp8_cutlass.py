"""The CUTLASS blockwise-FP8 GEMM library (trainer/fp8/csrc, trainer.fp8.cutlass_gemm).

CPU: the ctypes signature table against the C source, the config table, library discovery and its
"not available" reasons, argument checks, and (where a built library is present) that it loads and
refuses bad calls with a status instead of crashing. GPU (`gpu` marker; skipped with the reason when
the library or an sm_90 GPU is absent): every config of every kind against the emulation.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
from pathlib import Path

import pytest
import torch

from benchmarks import fp8_cutlass
from trainer.fp8 import cutlass_gemm as cg
from trainer.fp8 import gemm
from trainer.fp8 import quantize_1x128, quantize_128x128
from trainer.fp8.csrc import build
from trainer.fp8.gemm import _probe_operands, emulated_dgrad, emulated_fprop, emulated_wgrad
from trainer.fp8.triton_kernels import quant_act, quant_weight, triton_available

SOURCE = cg.SOURCE.read_text()


def _c_api_table(source: str) -> str:
    """PUROKIT_FP8_API of the C source, as ``ret name(params);`` entries without whitespace."""
    body = re.search(r"#define PUROKIT_FP8_API\(X\)((?:.*\\\n)*.*\n)", source).group(1).replace("\\\n", " ")
    entries = re.findall(r"X\(([^,]+),\s*(\w+),\s*\(([^)]*)\)\)", body)
    assert entries, "no entries in PUROKIT_FP8_API"
    return re.sub(r"\s+", "", "".join(f"{ret} {name}({params});" for ret, name, params in entries))


def test_ctypes_table_matches_the_c_source():
    assert _c_api_table(SOURCE) == cg.abi_string()
    for _, _, params in cg._API:
        for p in params:
            assert cg._param_type(p) in cg._CTYPES, p


def test_config_table_is_indexed_and_named_per_kind():
    rows = build.config_rows(SOURCE)
    assert len(rows) >= 4
    seen = set()
    for index, row in rows:
        m = re.match(r'X\((\d+),\s*(\d+),\s*"([^"]+)",\s*(\w+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\w+)\)', row)
        assert m, row
        kind, name, sched, tm, tiles = int(m.group(2)), m.group(3), m.group(4), int(m.group(5)), m.group(10)
        assert 0 <= kind < len(cg.KINDS) and (kind, name) not in seen
        seen.add((kind, name))
        assert build.uses_deepgemm(row) == sched.startswith("Dg"), row
        if build.uses_deepgemm(row):  # DeepGEMM: act_weight per (N, K) (named in the row), act_act any shape
            shape = re.fullmatch(r"DgN(\d+)K(\d+)", sched)
            assert name.startswith("deepgemm_") and tm in (64, 128, 256) and kind in (0, 1), row
            assert (shape is not None and name.endswith(f"_n{shape[1]}_k{shape[2]}")) if kind == 0 else sched == "DgAny", row
            assert int(m.group(8)) * int(m.group(9)) <= 2, row  # DeepGEMM multicasts to 2 CTAs at most
            continue
        assert sched in ("Coop", "Pingpong", "CoopPipelined") and tm in (128, 256)  # what the blockwise mainloop takes
        assert tiles == "Persistent" or (tiles == "StreamK" and sched == "Coop"), row  # no stream-K pingpong
        if sched == "CoopPipelined":  # three 64 x N accumulators a warpgroup (pipelined_promotion.hpp)
            assert tm == 128 and int(m.group(6)) <= 128 and name.startswith("pipelined_"), row
    for k in (0, 1):
        assert any(kind == k and name == cg.DEFAULT_ACT_WEIGHT for kind, name in seen)


def test_object_keys_change_only_for_the_changed_row():
    rows = build.config_rows(SOURCE)
    keys = [build.object_key(SOURCE, i, r, "nvcc", "4.7.0") for i, r in rows]
    assert len(set(keys)) == len(keys)
    added = SOURCE.replace(rows[-1][1], rows[-1][1] + ' \\\n  X(99, 0, "x", Coop, 128, 128, 128, 1, 1, Persistent)')
    assert [build.object_key(added, i, r, "nvcc", "4.7.0") for i, r in rows] == keys
    assert build.object_key(added, -1, "", "nvcc", "4.7.0") != build.object_key(SOURCE, -1, "", "nvcc", "4.7.0")
    # a whole-line comment changes no object; anything on a line of code does (conservative)
    commented = SOURCE.replace("namespace purokit_fp8 {", "// a note\nnamespace purokit_fp8 {", 1)
    assert build.object_key(commented, 0, rows[0][1], "nvcc", "4.7.0") == keys[0]
    trailing = SOURCE.replace("constexpr int kGroup = 128;", "constexpr int kGroup = 128;  // x", 1)
    assert build.object_key(trailing, 0, rows[0][1], "nvcc", "4.7.0") != keys[0]


def test_deepgemm_rows_alone_depend_on_deepgemm():
    rows = build.config_rows(SOURCE)
    dg_rows = [(i, r) for i, r in rows if build.uses_deepgemm(r)]
    cutlass_rows = [(i, r) for i, r in rows if not build.uses_deepgemm(r)]
    assert dg_rows and cutlass_rows

    def keys(dg_version: str, dg_header: str) -> dict[int, str]:
        return {i: build.row_key(SOURCE, i, r, "nvcc", "4.7.0", dg_version, "h", "h" + dg_header)
                for i, r in [(-1, "")] + rows}

    base = keys("none", "v1")
    checkout, header = keys("abc", "v1"), keys("none", "v2")
    # another DeepGEMM checkout (or none) rebuilds its rows only; its header, those and the API object
    assert {i for i in base if checkout[i] != base[i]} == {i for i, _ in dg_rows}
    assert {i for i in base if header[i] != base[i]} == {i for i, _ in dg_rows} | {-1}


def test_build_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("CUTLASS_DIR", raising=False)
    monkeypatch.setattr(build, "_wheel_cutlass", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"CUTLASS not found .*\[fp8-build\].* nvidia-cutlass=="):
        build.find_cutlass()
    with pytest.raises(FileNotFoundError, match="lacks include/cutlass/cutlass.h"):
        build.find_cutlass(str(tmp_path))
    for var in ("NVCC", "CUDA_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "_wheel_nvccs", lambda: [])
    with pytest.raises(FileNotFoundError, match=r"nvcc not found .*\[fp8-build\].*cuda-toolkit\[nvcc,cccl\]"):
        build.find_nvcc()
    assert build.main(["--out", str(tmp_path / "out")]) == 1  # one line, no traceback


def test_a_wheel_toolkit_missing_a_part_names_its_package(tmp_path, monkeypatch):
    """The pip toolkit is several wheels under nvidia/cu13: each part missing is named with its package;
    a system toolkit (another layout) is taken as whole."""
    root = tmp_path / "nvidia" / "cu13"
    nvcc = root / "bin" / "nvcc"
    parts = {"include/cuda_runtime.h": "nvidia-cuda-runtime", "include/crt/host_config.h": "nvidia-cuda-crt",
             "nvvm/bin/cicc": "nvidia-nvvm", "include/cccl/cuda/std/type_traits": "nvidia-cuda-cccl"}
    for path in (nvcc, *(root / p for p in parts)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    monkeypatch.setenv("NVCC_CCBIN", "sh")  # a host compiler "found" whether or not this machine has g++
    build.check_toolkit(str(nvcc))
    for part, package in parts.items():
        (root / part).rename(root / (part + ".away"))
        with pytest.raises(FileNotFoundError, match=re.escape(package)):
            build.check_toolkit(str(nvcc))
        (root / (part + ".away")).rename(root / part)
    system = tmp_path / "cuda-13.0" / "bin" / "nvcc"
    system.parent.mkdir(parents=True)
    system.write_text("")
    build.check_toolkit(str(system))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NVCC_CCBIN", raising=False)
    with pytest.raises(FileNotFoundError, match="apt-get install g\\+\\+"):
        build.check_toolkit(str(system))


def test_spills_are_read_from_the_ptxas_log():
    log = ("ptxas info    : Used 168 registers, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : 192 bytes stack frame, 564 bytes spill stores, 568 bytes spill loads\n")
    assert build.spilled_bytes(log) == 564 and build.spilled_bytes(log.splitlines()[0]) == 0
    assert build.spilled_bytes("") == 0


def test_parallel_compiles_are_bounded_by_cores_and_memory():
    gib = 2**30
    assert build.auto_jobs(16, 128 * gib) == 16
    assert build.auto_jobs(16, 20 * gib) == 5
    assert build.auto_jobs(2, 3 * gib) == 1


@pytest.mark.slow
def test_the_sources_compile_for_sm90a_from_the_packages_alone(tmp_path, monkeypatch):
    """The quantizers, the exported API and one CUTLASS config compile for sm_90a on a machine without a GPU
    from the fp8-build extra's wheels (nvcc, the CUDA headers, CUTLASS), not a system toolkit or a checkout,
    and link into a library whose exported table is the one cutlass_gemm speaks. ~1 min and ~4 GB."""
    nvccs = [n for n in build._wheel_nvccs() if os.path.isfile(n)]
    cutlass = build._wheel_cutlass()
    assert nvccs and cutlass is not None, f"the fp8-build extra is not installed: {build.PIP_EXTRA}"
    for var in ("NVCC", "CUDA_HOME", "CUTLASS_DIR", "DEEPGEMM_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not (Path(p) / "nvcc").exists()))
    assert build.find_nvcc() == nvccs[0] and build.find_cutlass() == cutlass
    config = 0
    path = build.build(tmp_path, jobs=2, only=[config])
    logs = {p.name.rsplit("-", 1)[0]: p.read_text() for p in (tmp_path / "obj").glob("cfg*.log")}
    assert set(logs) == {"cfg-1", f"cfg{config}", "cfgquant"}
    for name in (f"cfg{config}", "cfgquant"):  # ptxas -v: the kernels were compiled to sm_90a code
        assert "for 'sm_90a'" in logs[name], logs[name][-2000:]
    assert "bytes spill" in logs[f"cfg{config}"] and build.spilled_bytes(logs[f"cfg{config}"]) == 0
    lib = cg.Library(path)  # loads without a driver (static runtime); its ABI is checked on load
    assert lib.configs["act_weight"] == {cg.DEFAULT_ACT_WEIGHT: config} and not lib.configs["act_act"]


def test_missing_library_says_where_it_looked(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere" / cg.LIB_NAME
    monkeypatch.setenv(cg.LIB_ENV, str(missing))
    assert cg.library_candidates() == [missing]
    ok, reason = cg.available()
    assert not ok and str(missing) in reason and "trainer.fp8.csrc.build" in reason
    assert cg.configs("act_weight") == []
    with pytest.raises(ValueError, match="unknown GEMM kind"):
        cg.configs("fprop")


def test_unloadable_library_gives_the_loader_error(tmp_path, monkeypatch):
    bogus = tmp_path / cg.LIB_NAME
    bogus.write_text("not an ELF file\n")
    monkeypatch.setenv(cg.LIB_ENV, str(bogus))
    ok, reason = cg.available()
    assert not ok and reason.startswith(f"cannot load {bogus}")


def test_default_search_path_is_the_repo_build_then_the_cache(monkeypatch):
    monkeypatch.delenv(cg.LIB_ENV, raising=False)
    first, second = cg.library_candidates()
    assert first == cg.REPO_ROOT / ".gpu_build" / cg.LIB_NAME
    assert second.parts[-3:] == (".cache", "purokit", cg.LIB_NAME)


def _fp8(*shape):
    return torch.zeros(shape, dtype=torch.float8_e4m3fn)


def test_argument_checks_name_the_shape():
    m, n, k = 256, 384, 640
    a, b = _fp8(m, k), _fp8(n, k)
    sa, sb_block, sb_row = torch.ones(m, k // 128), torch.ones(n // 128, k // 128), torch.ones(n, k // 128)
    assert cg.check_operands("act_weight", a, b, sa, sb_block) == (m, n, k)
    assert cg.check_operands("act_act", a, b, sa, sb_row) == (m, n, k)
    with pytest.raises(ValueError, match=r"\(M, N, K\) = \(200, 384, 640\) must be positive multiples of 128"):
        cg.check_operands("act_weight", _fp8(200, k), b, torch.ones(200, 5), sb_block)
    with pytest.raises(ValueError, match=r"differ in K"):
        cg.check_operands("act_weight", a, _fp8(n, 512), sa, sb_block)
    with pytest.raises(ValueError, match="must be float8_e4m3fn"):
        cg.check_operands("act_weight", a.float(), b, sa, sb_block)
    with pytest.raises(ValueError, match=r"sb must be float32 \(3, 5\)"):
        cg.check_operands("act_weight", a, b, sa, sb_row)
    with pytest.raises(ValueError, match=r"sb must be float32 \(384, 5\)"):
        cg.check_operands("act_act", a, b, sa, sb_block)
    # well-formed CPU operands reach the device check (or the missing library)
    with pytest.raises(RuntimeError, match="unavailable|need CUDA tensors"):
        cg.fprop(a, sa, b, sb_block)
    with pytest.raises(ValueError, match="must be positive multiples of 128"):
        cg.wgrad(_fp8(m, 100), torch.ones(m, 1), _fp8(n, 100), torch.ones(n, 1))


def _best(gemm_role, mnk, speedup, relerr, config="coop_256x128_c2x1"):
    m, n, k = mnk
    return {"layer": "x", "gemm": gemm_role, "M": m, "N": n, "K": k, "cublas_tflops": 1000.0,
            "cutlass_tflops": 1000.0 * speedup, "speedup": speedup, "config": config, "raster": "n",
            "swizzle": 8, "relerr_vs_cublas": relerr}


def test_quantizer_impl_choice_is_checked_and_explains_a_refusal():
    from trainer.fp8 import triton_kernels as tk

    x = torch.zeros(128, 256, dtype=torch.bfloat16)
    assert tk._use_cuda("triton", x) is False
    assert tk._use_cuda("auto", x) is False  # a CPU tensor: the Triton kernels (or none) take it
    with pytest.raises(ValueError, match="expected one of"):
        tk._use_cuda("cutlass", x)
    with pytest.raises(RuntimeError, match="cannot take"):
        tk._use_cuda("cuda", x)


def test_gemm_table_takes_cutlass_only_where_faster_and_in_agreement(tmp_path):
    record = {"device": {"gpu": "NVIDIA H200", "date_utc": "2026-12-01 19:59"}, "best": [
        _best("fprop", (32768, 4096, 2048), 0.93, 0.0),
        _best("fprop", (32768, 2048, 2048), 1.17, 0.0),
        _best("dgrad", (32768, 2048, 2048), 1.01, 0.0),        # under the 1.02 margin
        _best("wgrad", (2048, 2048, 32768), 1.20, 0.5),        # fast but disagrees with cuBLAS
        _best("wgrad", (4096, 2048, 32768), 1.10, None),       # not checked
        _best("wgrad", (2048, 6144, 32768), 1.09, 1e-3, "coop_128x128_c1x1_streamk"),
    ]}
    path = tmp_path / "gemm_table.json"
    path.write_text(json.dumps({"devices": {"NVIDIA H100": {"fprop": {}}, "NVIDIA H200": {"stale": {}}}}))
    table = fp8_cutlass.write_table(record, path)
    assert json.loads(path.read_text()) == table
    assert set(table["devices"]) == {"NVIDIA H100", "NVIDIA H200"} and "stale" not in table["devices"]["NVIDIA H200"]
    assert table["measured"] == "2026-12-01 19:59" and "--write-table" in table["command"] and "1.02" in table["rule"]
    rows = table["devices"]["NVIDIA H200"]
    assert rows["fprop"] == {"32768x4096x2048": {"library": "cublas"},
                             "32768x2048x2048": {"library": "cutlass", "config": "coop_256x128_c2x1",
                                                 "raster": "n", "swizzle": 8}}
    assert rows["dgrad"]["32768x2048x2048"] == {"library": "cublas"}
    assert [v["library"] for v in rows["wgrad"].values()] == ["cublas", "cublas", "cutlass"]
    # what trainer.fp8.gemm reads from it, at the measured token count and the nearest other one
    want = gemm.GemmChoice("cutlass", "coop_256x128_c2x1", "n", 8)
    assert gemm.table_entry("NVIDIA H200", "fprop", 32768, 2048, 2048, table["devices"]) == want
    assert gemm.table_entry("NVIDIA H200", "fprop", 8192, 2048, 2048, table["devices"]) == want
    assert gemm.table_entry("NVIDIA H200", "wgrad", 2048, 6144, 8192, table["devices"]).config == "coop_128x128_c1x1_streamk"
    assert gemm.table_entry("NVIDIA H100", "fprop", 32768, 2048, 2048, table["devices"]) is None


def test_a_run_over_some_linears_merges_its_rows_into_the_table(tmp_path):
    path = tmp_path / "gemm_table.json"
    full = {"device": {"gpu": "NVIDIA H200", "date_utc": "2026-12-03 12:36"}, "best": [
        _best("fprop", (32768, 2048, 2048), 1.17, 0.0), _best("wgrad", (2048, 6144, 32768), 1.10, 0.0)]}
    fp8_cutlass.write_table(full, path)
    part = {"device": {"gpu": "NVIDIA H200", "date_utc": "2026-12-04 09:00"},
            "command": "python3 benchmarks/fp8_cutlass.py --linears gate --write-table", "best": [
                _best("wgrad", (6144, 2048, 32768), 1.08, 0.0), _best("fprop", (32768, 2048, 2048), 0.99, 0.0)]}
    table = fp8_cutlass.write_table(part, path, merge=True)
    assert json.loads(path.read_text()) == table
    rows = table["devices"]["NVIDIA H200"]
    assert rows["wgrad"]["2048x6144x32768"]["library"] == "cutlass"      # kept: not measured again
    assert rows["wgrad"]["6144x2048x32768"]["library"] == "cutlass"      # added
    assert rows["fprop"]["32768x2048x2048"] == {"library": "cublas"}     # re-measured: the new verdict
    assert table["measured"] == "2026-12-03 12:36"
    assert table["updates"] == [{"measured": "2026-12-04 09:00", "command": part["command"]}]


def test_the_committed_gemm_table_names_configs_the_source_builds():
    names = {(cg.KINDS[int(kind)], name) for kind, name in
             re.findall(r'X\(\d+,\s*(\d+),\s*"([^"]+)"', SOURCE)}
    kind_of = gemm.ROLE_KIND
    table = json.loads(gemm.GEMM_TABLE.read_text())
    for device, roles in table["devices"].items():
        for role, shapes in roles.items():
            assert role in kind_of, (device, role)
            for shape, choice in shapes.items():
                assert all(int(d) % 128 == 0 for d in shape.split("x")), (device, role, shape)
                assert choice["library"] in ("cublas", "cutlass"), choice
                if choice["library"] == "cutlass":
                    assert (kind_of[role], choice["config"]) in names, (device, role, shape, choice)
                    assert choice["raster"] in cg.RASTER and choice["swizzle"] in (1, 2, 4, 8)


@pytest.fixture()
def built_library(monkeypatch):
    monkeypatch.delenv(cg.LIB_ENV, raising=False)
    lib, reason = cg.library()
    if lib is None:
        pytest.skip(reason)
    return lib


def test_built_library_loads_and_refuses_bad_calls(built_library):
    lib = built_library
    assert lib.configs["act_weight"] and lib.configs["act_act"]
    assert cg.DEFAULT_ACT_WEIGHT in lib.configs["act_weight"] and cg.DEFAULT_ACT_ACT in lib.configs["act_act"]
    size = ctypes.c_size_t(0)
    assert lib.dll.purokit_fp8_workspace_size(0, 100, 128, 128, 0, 1, ctypes.byref(size)) == 101
    assert "multiples of 128" in lib.status(101)
    assert lib.dll.purokit_fp8_workspace_size(10_000, 128, 128, 128, 0, 1, ctypes.byref(size)) == 100
    act_act = next(iter(lib.configs["act_act"].values()))
    # a config of the other kind, null operands: refused before anything reaches the GPU
    assert lib.dll.purokit_fp8_act_weight(act_act, None, None, None, None, None, 128, 128, 128, 0, 1, None, 0, None) == 100
    assert lib.dll.purokit_fp8_act_weight(0, None, None, None, None, None, 128, 128, 128, 0, 1, None, 0, None) == 105
    # a misaligned address would make a bad TMA descriptor (CUTLASS's check is an assert): refused
    assert lib.dll.purokit_fp8_act_weight(0, 1024, 1024, 1024, 1024, 1040 + 8, 128, 128, 128, 0, 1, None, 0, None) == 106
    assert "16-byte aligned" in lib.status(106)
    assert lib.status(4) == "Error Invalid Problem" and lib.status(12345) == "unknown status"


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------

_OK, _WHY = cg.available() if torch.cuda.is_available() else (False, "needs CUDA")


def gpu(fn):
    """A GPU test: `gpu` marker, skipped with the reason when the library or an sm_90 GPU is absent."""
    return pytest.mark.gpu(pytest.mark.skipif(not _OK, reason=_WHY)(fn))


BF16_TOL = 2e-3  # bf16 output rounding (relative 2^-9 per element)
FP32_TOL = 5e-4  # summation order, and inside each 128-K chunk the FP8 WGMMA accumulates at reduced precision


def _relerr(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@functools.lru_cache(maxsize=1)  # the configs of one shape run one after another: quantize once
def _operands(m, k, n, seed=0):
    """FP8 x (M, K) per 1x128, w (N, K) per 128x128, dy (M, N) per 1x128, and the token-quantized
    transposes, with magnitudes spread over binades so a misplaced scale shows."""
    x, w = _probe_operands("cuda", m, k, n, seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    dy = (torch.randn(m, n, device="cuda", generator=g)
          * torch.exp2(torch.randint(-6, 7, (1, n), device="cuda", generator=g).float())).to(torch.bfloat16)
    xq, xs = quantize_1x128(x)
    wq, ws = quantize_128x128(w)
    dyq, dys = quantize_1x128(dy)
    dytq, dyts = quantize_1x128(dy.t())
    xtq, xts = quantize_1x128(x.t())
    return dict(xq=xq, xs=xs, wq=wq, ws=ws, wtq=wq.t().contiguous(), dyq=dyq, dys=dys, dytq=dytq, dyts=dyts,
                xtq=xtq, xts=xts)


RAGGED = (256, 640, 384)  # K/128 = 5 reduction blocks (not a multiple of 4), N/128 = 3
SHAPES_17B = [(2048, 4096), (2048, 2048), (2048, 12288), (6144, 2048)]  # (K, N): qkv, o, gate-up, down
MKN = [RAGGED] + [(4096, k, n) for k, n in SHAPES_17B]
MKN_IDS = ["ragged"] + [f"1.7b-{k}x{n}" for k, n in SHAPES_17B]


def _any_shape_configs(kind: str) -> list[str]:
    return [c for c in cg.configs(kind) if cg.config_shape(kind, c) is None]


def every_config_and_shape(kind: str):
    """A GPU test over every config of ``kind`` that runs any shape and every (M, K, N) of MKN."""
    configs = pytest.mark.parametrize("config", _any_shape_configs(kind) or ["none"])
    shapes = pytest.mark.parametrize("mkn", MKN, ids=MKN_IDS)
    return lambda fn: gpu(configs(shapes(fn)))


@every_config_and_shape("act_weight")
def test_act_weight_matches_emulation(config, mkn):
    m, k, n = mkn
    o = _operands(m, k, n)
    y = cg.fprop(o["xq"], o["xs"], o["wq"], o["ws"], config)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    err = _relerr(y, emulated_fprop(o["xq"], o["xs"], o["wq"], o["ws"]))
    assert err < BF16_TOL, f"fprop {config} {mkn}: rel. error {err:.2e}"
    dx = cg.dgrad(o["dyq"], o["dys"], o["wtq"], o["ws"], config)
    assert dx.shape == (m, k)
    err = _relerr(dx, emulated_dgrad(o["dyq"], o["dys"], o["wq"], o["ws"]))
    assert err < BF16_TOL, f"dgrad {config} {mkn}: rel. error {err:.2e}"


@every_config_and_shape("act_act")
def test_act_act_matches_emulation_and_accumulates(config, mkn):
    m, k, n = mkn
    o = _operands(m, k, n)
    ref = emulated_wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"])
    dw = cg.wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], config)
    assert dw.dtype == torch.float32 and dw.shape == (n, k)
    err = _relerr(dw, ref)
    assert err < FP32_TOL, f"wgrad {config} {mkn}: rel. error {err:.2e}"
    grad = torch.randn(n, k, device="cuda") * ref.abs().mean()
    before = grad.clone()
    same = cg.wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], config, out=grad)
    assert same is grad
    err = _relerr(grad, before + ref)
    assert err < FP32_TOL, f"wgrad accumulate {config} {mkn}: rel. error {err:.2e}"


SHAPED = [c for c in cg.configs("act_weight") if cg.config_shape("act_weight", c) is not None]


@gpu
@pytest.mark.parametrize("config", SHAPED or ["none"])
def test_shape_compiled_configs_match_emulation_and_refuse_other_shapes(config):
    """DeepGEMM's act_weight kernels, each compiled for one (N, K): M = 640 leaves the last 256-row tile
    half empty; any other (N, K) is refused with a status naming why, not run."""
    if config not in SHAPED:
        pytest.skip("the library holds no shape-compiled act_weight config (built without $DEEPGEMM_DIR)")
    n, k = cg.config_shape("act_weight", config)
    m = 640
    x, w = _probe_operands("cuda", m, k, n, 3)
    xq, xs = quantize_1x128(x)
    wq, ws = quantize_128x128(w)
    y = cg.act_weight(xq, wq, xs, ws, config)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    err = _relerr(y, emulated_fprop(xq, xs, wq, ws))
    assert err < BF16_TOL, f"{config} at (M, N, K) = ({m}, {n}, {k}): rel. error {err:.2e}"
    xq2, xs2 = quantize_1x128(x[:, : k - 128].contiguous())
    wq2, ws2 = quantize_128x128(w[:, : k - 128].contiguous())
    with pytest.raises(RuntimeError, match="compiled for another"):
        cg.act_weight(xq2, wq2, xs2, ws2, config)


PIPELINED = {kind: [c for c in cg.configs(kind) if c.startswith("pipelined_")] for kind in ("act_weight", "act_act")}


@gpu
@pytest.mark.parametrize("mkn", MKN + [(256, 128, 128)], ids=MKN_IDS + ["one-k-tile"])
def test_pipelined_promotion_equals_the_reference_mainloop_bit_for_bit(mkn):
    """The pipelined mainloop (csrc/pipelined_promotion.hpp) promotes the same k-blocks in the same order with
    the same roundings as CUTLASS's: its results equal the reference config's exactly, at every k-tile count
    (one k-tile; ragged K = 5 and 3 blocks: odd counts; the 1.7B shapes: even counts) and through both of its temporaries."""
    m, k, n = mkn
    o = _operands(m, k, n)
    if not (PIPELINED["act_weight"] and PIPELINED["act_act"]):
        pytest.skip("the library has no pipelined configs")
    y_ref = cg.fprop(o["xq"], o["xs"], o["wq"], o["ws"], cg.DEFAULT_ACT_WEIGHT)
    dx_ref = cg.dgrad(o["dyq"], o["dys"], o["wtq"], o["ws"], cg.DEFAULT_ACT_WEIGHT)
    dw_ref = cg.wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], cg.DEFAULT_ACT_ACT)
    for config in PIPELINED["act_weight"]:
        assert torch.equal(cg.fprop(o["xq"], o["xs"], o["wq"], o["ws"], config), y_ref), config
        assert torch.equal(cg.dgrad(o["dyq"], o["dys"], o["wtq"], o["ws"], config), dx_ref), config
    for config in PIPELINED["act_act"]:
        assert torch.equal(cg.wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], config), dw_ref), config


@gpu
@pytest.mark.parametrize("config", cg.configs("act_act_bf16") or ["none"])
def test_act_act_bf16_output(config):
    m, k, n = RAGGED
    o = _operands(m, k, n)
    if config not in cg.configs("act_act_bf16"):
        pytest.skip("the library has no act_act_bf16 config")
    dw = cg.wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], config, out_dtype=torch.bfloat16)
    assert dw.dtype == torch.bfloat16
    assert _relerr(dw, emulated_wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"])) < BF16_TOL


@gpu
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_wgrad_through_the_table_serves_either_weight_dtype(out_dtype):
    """The table names fp32-output Wgrad configs; a BF16 weight's gradient through them (``lib="cutlass"``:
    the table's config at the 1.7B qkv shape, or the first one) is the fp32 result rounded, not an error."""
    if not cg.configs("act_act"):
        pytest.skip("no act_act config in the library")
    m, k, n = 256, 2048, 4096  # tokens, in, out: the qkv Wgrad at a short micro-batch
    o = _operands(m, k, n)
    caps = gemm.probe_scaled_mm("cuda")
    dw = gemm.scaled_mm_wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], caps, out_dtype=out_dtype, lib="cutlass")
    assert dw.dtype == out_dtype and dw.shape == (n, k)
    err = _relerr(dw, emulated_wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"]))
    assert err < (FP32_TOL if out_dtype == torch.float32 else BF16_TOL), f"{out_dtype}: rel. error {err:.2e}"


@gpu
@pytest.mark.parametrize("lib", ["cutlass", "cublas"])
def test_wgrad_into_the_fp32_gradient_adds_what_the_wgrad_returns(lib):
    """`scaled_mm_wgrad_into` (the Wgrad of `step_weights(grads=True)`): the CUTLASS epilogue's beta = 1 addition
    and cuBLAS's product added give, twice over, the bits of the returned gradient summed as autograd sums."""
    if lib == "cutlass" and not cg.configs("act_act"):
        pytest.skip("no act_act config in the library")
    m, k, n = 256, 2048, 4096
    o = _operands(m, k, n)
    caps = gemm.probe_scaled_mm("cuda")
    dw = gemm.scaled_mm_wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], caps, lib=lib)
    grad = torch.zeros(n, k, device="cuda")
    for _ in range(2):
        gemm.scaled_mm_wgrad_into(o["dytq"], o["dyts"], o["xtq"], o["xts"], grad, caps, lib=lib)
    assert torch.equal(grad, dw + dw)


@gpu
def test_triton_quantizer_layouts_feed_the_kernels_without_copies():
    if not triton_available():
        pytest.skip("needs Triton")
    m, k, n = 512, 640, 384
    x, w = _probe_operands("cuda", m, k, n)
    q, s, qt, st = quant_act(x, True, True, True)
    wq, wtq, ws = quant_weight(w, True, True)
    assert s.stride(0) == 1 and st.stride(0) == 1  # column-major 1x128 scales, used as they are
    y = cg.fprop(q, s, wq, ws)
    assert _relerr(y, emulated_fprop(q, s, wq, ws)) < BF16_TOL
    dw = cg.wgrad(qt, st, qt, st)  # x^T x: both operands quantized along the tokens
    assert _relerr(dw, emulated_wgrad(qt, st, qt, st)) < FP32_TOL


@gpu
def test_compiled_graph_keeps_the_ops():
    o = _operands(*RAGGED)

    def f(xq, xs, wq, ws, dytq, dyts, xtq, xts, grad):
        cg.wgrad(dytq, dyts, xtq, xts, out=grad)
        return cg.fprop(xq, xs, wq, ws)

    grad = torch.zeros(RAGGED[2], RAGGED[1], device="cuda")
    args = (o["xq"], o["xs"], o["wq"], o["ws"], o["dytq"], o["dyts"], o["xtq"], o["xts"])
    y = torch.compile(f, fullgraph=True)(*args, grad)
    assert _relerr(y, emulated_fprop(o["xq"], o["xs"], o["wq"], o["ws"])) < BF16_TOL
    assert _relerr(grad, emulated_wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"])) < FP32_TOL

