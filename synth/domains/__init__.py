"""Domain generators of Nemotron 3 Super's SDG pipelines, each with its own verification:
code concepts (§2.3.2), tool use (§3.1.1 conversational and general), finance (§3.1.1),
text-to-SQL (§3.1.1) and MCQ with reasoning traces (§2.3.6).

Validators are pure functions in `*_validate.py` modules; generators (one module each) run them
on the synth engine's pipeline.
"""

import importlib

# generator name (its YAML in this directory) -> the module that registers its sources and steps
GENERATOR_MODULES = {
    "text_to_sql": "synth.domains.text_to_sql",
    "tool_use": "synth.domains.tool_use",
    "tool_use_conversational": "synth.domains.customer_service",
    "code_concepts": "synth.domains.code_concepts",
    "finance": "synth.domains.finance",
    "mcq": "synth.domains.mcq",
}


def import_all() -> None:
    """Register every domain generator's sources, steps and post steps with the engine."""
    for mod in sorted(set(GENERATOR_MODULES.values())):
        importlib.import_module(mod)
