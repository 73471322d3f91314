"""trainer: Qwen3-style decoder, MuonH + AdamW, schedules, FP8 linears, checkpoints, averaging, export."""
