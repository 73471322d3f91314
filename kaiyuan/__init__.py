"""kaiyuan: Spark ingest, dedup and quality annotation of raw sources into components."""
