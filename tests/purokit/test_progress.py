"""The one progress reporter: its line form, its cadence and its modes."""

import pytest

from purokit.progress import Reporter, progress_text, resolve_mode


def test_line_form_names_unit_count_and_message():
    assert progress_text("step", 3, 10, "loss 2.1000") == "step 3/10 | loss 2.1000"
    assert progress_text("document", 7, None) == "document 7"


def test_line_mode_prints_every_n_units_and_the_last():
    lines = []
    rep = Reporter(5, unit="step", mode="line", every=2, write=lines.append)
    for i in range(1, 6):
        rep.update(i, f"x {i}")
    rep.note("eval done")
    rep.close()
    assert lines == ["step 2/5 | x 2", "step 4/5 | x 4", "step 5/5 | x 5", "eval done"]


def test_none_mode_prints_nothing():
    lines = []
    rep = Reporter(3, unit="prompt", mode="none", write=lines.append)
    rep.update(3, "done")
    assert lines == []


def test_auto_is_line_off_a_terminal_and_bad_mode_is_named():
    class Pipe:
        def isatty(self):
            return False
    assert resolve_mode("auto", Pipe()) == "line"
    with pytest.raises(ValueError, match="progress mode 'fancy'"):
        resolve_mode("fancy")
