import subprocess
import sys

import pytest

from tests.conftest import short_spark_env


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """The demo chain at reduced size (`--profile ci`), run once for every test that reads it."""
    out = tmp_path_factory.mktemp("demo-ci")
    proc = subprocess.run([sys.executable, "-m", "purokit.demo", "--profile", "ci", "--out", str(out)],
                          capture_output=True, text=True, timeout=1500, env=short_spark_env())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out, proc.stdout
