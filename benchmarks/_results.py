"""Where a benchmark script leaves its figures: `benchmarks/_work/<name>.json`, also printed."""

from __future__ import annotations

import json
from pathlib import Path

WORK = Path(__file__).resolve().parent / "_work"


def save(name: str, result: dict) -> Path:
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return path
