"""One logging setup for every command: `time level name: message` on stderr."""

from __future__ import annotations

import logging
import os
import sys


def get_logger(name: str) -> logging.Logger:
    root = logging.getLogger()
    if not getattr(root, "_purokit_configured", False):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("PUROKIT_LOG_LEVEL", "INFO"))
        for noisy in ("py4j", "httpx", "urllib3", "filelock", "matplotlib", "datasets"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        root._purokit_configured = True  # type: ignore[attr-defined]
    return logging.getLogger(name)
