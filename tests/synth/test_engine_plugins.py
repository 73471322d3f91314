"""A generator whose prompt source lives in an `imports:` module loads by name through the engine
(`python -m synth <name>`), not only through `python -m synth.domains`."""

from synth.engine import load_generator
from synth.sources import load_rows


def test_domain_generator_source_registered_by_its_imports():
    cfg = load_generator("text_to_sql", ["source.n=3"])
    rows, counts = load_rows(cfg.source, cfg.seed, cfg.limit)
    assert len(rows) == 3 and counts["n_input"] == 3
    assert all(r["prompt"] for r in rows)
