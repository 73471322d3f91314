"""`python -m synth.domains <generator> --endpoint URL --model NAME --out DIR [key=value ...]`

The same command line as `python -m synth`, with every domain module imported first, so the
domain generators' prompt sources (`sql_buckets`, `tool_tasks`, `service_domains`,
`concept_combos`, `finance_questions`, `mcq_seeds`) are registered before the engine loads the
prompts. Generators: text_to_sql, tool_use, tool_use_conversational, code_concepts, finance, mcq.
"""

from __future__ import annotations

import sys

from synth.domains import GENERATOR_MODULES, import_all


def main(argv: list[str] | None = None) -> int:
    import_all()
    from synth.__main__ import main as synth_main

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nGenerators and their modules: " + ", ".join(f"{g} ({m})" for g, m in GENERATOR_MODULES.items()))
        return 0
    return synth_main(args)


if __name__ == "__main__":
    sys.exit(main())
