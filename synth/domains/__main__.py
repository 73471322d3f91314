"""`python -m synth.domains ...`: the same as `python -m synth ...` (kept for existing scripts).

The domain generators (text_to_sql, tool_use, tool_use_conversational, code_concepts, finance,
mcq) run with `python -m synth <generator> ...`: each YAML's `imports:` registers its sources
and steps.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from synth.__main__ import main as synth_main

    return synth_main(argv)


if __name__ == "__main__":
    sys.exit(main())
