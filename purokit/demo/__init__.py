"""The main job (`make demo`): the whole Puro recipe end to end on data built locally, no network.

Stages live in their own modules and are listed in `purokit.demo.stages.STAGES`; `python -m purokit.demo` runs
them in order, reusing a stage that finished before (its `stage.json`), and ends by printing
where everything is.
"""
