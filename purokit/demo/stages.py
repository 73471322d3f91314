"""The demo's stages, in order. Each module defines `run(ctx) -> dict` (paths and figures it wants
shown) and may define `summary(result) -> list[str]` for the final listing.

The order follows the Puro recipe: data (corpus, kaiyuan), tokenizer, proxy experiments to pick
thresholds and weights, materialization, pretraining (phase 1, then UD/CD/CMA), then synthetic SFT
data from a teacher and a short SFT of the CMA model, and the report."""

STAGES: list[tuple[str, str]] = [
    ("corpus", "purokit.demo.corpus"),                  # multi-source raw corpus with planted near-duplicates
    ("kaiyuan", "purokit.demo.kaiyuan_stage"),          # spark-submit: ingest, dedup, quality annotation
    ("tokenizer", "purokit.demo.tokenizer_stage"),      # byte-level BPE on the components
    ("proxy", "purokit.demo.proxy_stage"),              # quantile slices, proxy runs, profiles, PCA
    ("mixtures", "purokit.demo.mixtures_stage"),        # mixture spec, curriculum and uniform shard sets
    ("trainer", "purokit.demo.trainer_stage"),          # phase 1; UD, CD, CMA; export
    ("synth", "purokit.demo.synth_stage"),              # local teacher: reasoning on/off pairs
    ("synth_domains", "purokit.demo.synth_domains_stage"),  # text-to-SQL and tool use against the teacher
    ("sft", "purokit.demo.sft_stage"),                  # SFT shards from the synthetic data, short SFT
]
