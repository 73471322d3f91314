"""Blockwise FP8 linears (Puro §3.2): recipe, quantizers, GEMMs, the ``Fp8Linear`` module and the
``convert_to_fp8`` converter the training loop calls when ``precision: fp8-blockwise``."""

from trainer.fp8.convert import convert_to_fp8, fp8_module_names, resolve_recipe
from trainer.fp8.gemm import ScaledMmCaps, probe_scaled_mm
from trainer.fp8.linear import Fp8Linear, fp8_linear, step_weights
from trainer.fp8.modules import Fp8Attention, Fp8MLP, stacked_linears, stacked_weight, weight_stacks
from trainer.fp8.quantize import (
    dequantize_1x128,
    dequantize_128x128,
    quantize_1x128,
    quantize_128x128,
    scales_from_amax,
)
from trainer.fp8.recipe import E4M3_MAX, GROUP, Fp8Recipe

__all__ = [
    "E4M3_MAX",
    "Fp8Attention",
    "Fp8MLP",
    "GROUP",
    "Fp8Linear",
    "Fp8Recipe",
    "ScaledMmCaps",
    "convert_to_fp8",
    "dequantize_128x128",
    "dequantize_1x128",
    "fp8_linear",
    "fp8_module_names",
    "probe_scaled_mm",
    "quantize_128x128",
    "quantize_1x128",
    "resolve_recipe",
    "scales_from_amax",
    "stacked_linears",
    "stacked_weight",
    "step_weights",
    "weight_stacks",
]
