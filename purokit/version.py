"""The code version recorded in every manifest: package version plus git commit when available."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    try:
        version = metadata.version("purokit")
    except metadata.PackageNotFoundError:
        version = "0.0.0"
    try:
        sha = subprocess.run(
            ["git", "-C", str(_REPO), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(_REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        return f"{version}+g{sha}{'.dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        return version
