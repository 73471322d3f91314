"""Domain generators of Nemotron 3 Super's SDG pipelines, each with its own verification:
code concepts (§2.3.2), tool use (§3.1.1 conversational and general), finance (§3.1.1),
text-to-SQL (§3.1.1) and MCQ with reasoning traces (§2.3.6).

Validators are pure functions in `*_validate.py` modules; generators (one module each) run them
on the synth engine's pipeline.
"""
