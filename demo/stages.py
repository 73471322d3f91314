"""The demo's stages, in order. Each module defines `run(ctx) -> dict` (paths and figures it wants
shown) and may define `summary(result) -> list[str]` for the final listing."""

STAGES: list[tuple[str, str]] = [
    # (stage name, module)
    ("corpus", "demo.corpus"),
    ("kaiyuan", "demo.kaiyuan_stage"),
    ("synth", "demo.synth_stage"),
    ("synth_domains", "demo.synth_domains_stage"),
    ("tokenizer", "demo.tokenizer_stage"),
    ("proxy", "demo.proxy_stage"),
    ("mixtures", "demo.mixtures_stage"),
    ("trainer", "demo.trainer_stage"),
]
