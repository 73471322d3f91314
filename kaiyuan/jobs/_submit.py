"""What `spark-submit kaiyuan/jobs/<job>.py` runs: put the package on `sys.path` (installed, shipped
with `--py-files`, or this source checkout) without the job files shadowing modules of the same
name, then run the job whose file passed its name as `JOB`."""

import importlib.util
import sys
from pathlib import Path

_here = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
if importlib.util.find_spec("kaiyuan") is None:  # not installed nor shipped with --py-files: this checkout
    sys.path.insert(0, str(_here.parents[1]))
from kaiyuan.jobs import main  # noqa: E402

sys.exit(main(globals()["JOB"]))  # set by the job file through runpy
