"""``convert_to_fp8(model, cfg)``: swap the Transformer blocks' linears for :class:`Fp8Linear`.

The model file never mentions FP8 (torchtitan's converter pattern): the training loop calls this
once, after building the model and before ``torch.compile`` / DDP, when ``precision`` is
``fp8-blockwise``. Every ``nn.Linear`` is converted except those the recipe excludes (by default the
LM head: ``lm_head``, ``output``, ``head``), which in a Qwen3-style decoder leaves exactly q, k, v, o,
gate, up and down in FP8 and the embedding, LM head and norms in high precision (Puro §3.2).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
import torch.nn as nn
from pydantic import BaseModel

from trainer.fp8 import gemm
from trainer.fp8.linear import Fp8Linear
from trainer.fp8.modules import swap_fp8_modules
from trainer.fp8.recipe import Fp8Recipe

log = logging.getLogger(__name__)


def resolve_recipe(cfg: object = None) -> Fp8Recipe:
    """The :class:`Fp8Recipe` described by ``cfg``.

    Accepts ``None`` (Puro defaults), an ``Fp8Recipe``, a mapping of its fields, or a run config that
    carries one as ``cfg.fp8`` (or ``cfg.fp8_recipe``); a run config without such a section gets the
    defaults, provided its ``precision`` (if it has one) is ``fp8-blockwise``.
    """
    if cfg is None:
        return Fp8Recipe()
    if isinstance(cfg, Fp8Recipe):
        return cfg
    if isinstance(cfg, Mapping):
        return Fp8Recipe.model_validate(dict(cfg))
    for attr in ("fp8", "fp8_recipe"):
        sub = getattr(cfg, attr, None)
        if sub is not None:
            return resolve_recipe(sub)
    precision = getattr(cfg, "precision", None)
    if precision is not None:
        if str(precision) not in ("fp8-blockwise", "fp8_blockwise", "fp8"):
            raise ValueError(f"convert_to_fp8 called with a run config whose precision is {precision!r}")
        return Fp8Recipe()
    if isinstance(cfg, BaseModel):
        fields = {k: v for k, v in cfg.model_dump().items() if k in Fp8Recipe.model_fields}
        return Fp8Recipe.model_validate(fields)
    raise TypeError(
        f"convert_to_fp8: cannot read an FP8 recipe from {type(cfg).__name__}; pass None, an Fp8Recipe, "
        "a mapping of its fields, or a run config with an `fp8` section or `precision: fp8-blockwise`"
    )


def convert_to_fp8(model: nn.Module, cfg: object = None) -> nn.Module:
    """Replace, in place, every ``nn.Linear`` the recipe wants with an :class:`Fp8Linear` that
    shares its parameters, and give the model's attention and MLP their FP8 forms
    (``trainer.fp8.modules``: q|k|v as one stacked GEMM, the fused SwiGLU); return ``model``. Converting twice is a no-op. Raises if the model ends up
    with no FP8 linear at all (a model whose linears are not ``nn.Linear`` would otherwise silently
    train in BF16)."""
    recipe = resolve_recipe(cfg)
    converted: list[str] = []
    kept: list[str] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if not isinstance(child, nn.Linear) or isinstance(child, Fp8Linear):
                continue
            if type(child).__name__ == "NonDynamicallyQuantizableLinear":  # used by nn.MultiheadAttention
                kept.append(name)
                continue
            if recipe.wants(name):
                setattr(parent, child_name, Fp8Linear.from_linear(child, recipe))
                converted.append(name)
            else:
                kept.append(name)
    if not converted and not fp8_module_names(model):
        raise ValueError(
            f"convert_to_fp8: no nn.Linear to convert in {type(model).__name__} "
            f"(kept in high precision: {kept or 'none'}); check the recipe's include/exclude patterns"
        )
    swap_fp8_modules(model)
    if recipe.backend != "emulate" and torch.cuda.is_available():
        # find the cuBLAS layout once, eagerly, so that torch.compile later sees a settled choice
        device = next((p.device for p in model.parameters() if p.is_cuda), torch.device("cuda"))
        gemm.probe_scaled_mm(device)
    log.info(
        "fp8: %d linears in blockwise FP8 (scales %s, backend %s), %d kept: %s",
        len(converted), recipe.scale_format, recipe.backend, len(kept), ", ".join(kept) or "none",
    )
    return model


def fp8_module_names(model: nn.Module) -> list[str]:
    """Qualified names of the modules computed in FP8."""
    return [name for name, m in model.named_modules() if isinstance(m, Fp8Linear)]
