"""mixtures: mixture specs, rank-aligned curriculum buckets, static token shards and their reader."""
