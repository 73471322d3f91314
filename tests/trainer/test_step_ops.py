"""A training step runs the same torch ops as before the loop was split into parts (issue 36): the CPU
op sequences of one BF16 step and one FP8-emulation step, recorded from the code before the split by
`record_step_ops.py`, are what the current code gives. No op was filtered: with one intra-op thread
(both the recording and the test pin it) the CPU sequence is the same run after run; with two
threads some ops take other kernels' paths, so an unpinned recording differs under xdist."""

from __future__ import annotations

import json

import pytest

from tests.trainer.record_step_ops import DATA, step_ops


@pytest.mark.parametrize("tag", ["bf16", "fp8"])
def test_a_training_step_runs_the_recorded_op_sequence(tag):
    recorded = json.loads((DATA / f"step_ops_{tag}.json").read_text())
    got = step_ops(tag)
    first = next((i for i, (a, b) in enumerate(zip(recorded, got)) if a != b), min(len(recorded), len(got)))
    assert got == recorded, (f"{tag}: {len(got)} ops against {len(recorded)} recorded; first difference at op "
                             f"{first}: {got[first:first + 5]} against {recorded[first:first + 5]}")
