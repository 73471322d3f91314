"""The installed package: the wheel's top-level packages are the five the layout names plus `purokit`,
and the `purokit` command lists and runs every package's commands as `python -m` does."""

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from purokit.__main__ import PACKAGES, doc_commands

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL = {"kaiyuan", "synth", "proxy_eval", "mixtures", "trainer", "purokit"}
PUROKIT = Path(sys.executable).parent / "purokit"   # the console script `pip install -e .` wrote


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel built from a copy of the tracked files (no build output lands in the checkout)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for f in subprocess.check_output(["git", "ls-files", "-z"], cwd=REPO, text=True).split("\0"):
        if f and (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)])
    assert proc.returncode == 0, proc.stderr
    return zipfile.ZipFile(next(out.glob("purokit-*.whl")))


def test_wheel_top_level_is_the_five_packages_and_purokit(wheel):
    names = wheel.namelist()
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    top_level = wheel.read(f"{dist_info}/top_level.txt").decode().split()
    assert set(top_level) == TOP_LEVEL
    packages = {n.split("/")[0] for n in names if "/" in n} - {dist_info}
    assert packages == TOP_LEVEL
    assert {n for n in names if "/" not in n} == {"purokit-lm-eval.pth"}   # the lm-eval plugin line (issue 37)
    assert "purokit/demo/__main__.py" in names and "purokit/storage.py" in names
    entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert "purokit = purokit.__main__:main" in entry_points
    assert "purokit = proxy_eval.harness:PurokitLM" in entry_points


def test_doc_commands_reads_command_lines_not_prose():
    doc = ("`python -m pkg <command> ...`\n\nrun | stop   --config c.yaml\n      runs it; then stops\n"
           "show DIR\nmore prose about things\n    python -m pkg serve vllm [--port 8000]\n")
    assert doc_commands(doc) == ("python -m pkg <command> ...", ["run", "stop", "show", "serve"])


def test_purokit_lists_every_package_and_its_commands():
    proc = run([str(PUROKIT)])
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split(None, 1)[1] for line in proc.stdout.splitlines() if line.startswith("  ")}
    assert list(rows) == list(PACKAGES) == ["kaiyuan", "synth", "proxy_eval", "mixtures", "trainer", "demo"]
    assert "--profile" in rows["demo"] and "train" in rows["trainer"].split(", ")
    # the listing is the packages' own: an unknown command makes kaiyuan and mixtures name theirs
    for package in ("kaiyuan", "mixtures"):
        bad = run([str(PUROKIT), package, "no-such-command"])
        assert bad.returncode == 2
        assert all(re.search(rf"\b{re.escape(c)}\b", bad.stderr) for c in rows[package].split(", ")), bad.stderr


def test_purokit_package_runs_what_python_m_runs():
    ours, theirs = run([str(PUROKIT), "kaiyuan", "--help"]), run([sys.executable, "-m", "kaiyuan", "--help"])
    assert ours.returncode == theirs.returncode == 0
    assert ours.stdout == theirs.stdout and "pipeline" in ours.stdout
    demo = run([str(PUROKIT), "demo", "--help"])
    assert demo.returncode == 0 and "--profile" in demo.stdout
    missing = ["train", "--config", "no-such-run.yaml"]
    ours, theirs = run([str(PUROKIT), "trainer", *missing]), run([sys.executable, "-m", "trainer", *missing])
    assert ours.returncode == theirs.returncode == 2
    assert ours.stderr == theirs.stderr and "no-such-run.yaml" in ours.stderr
    unknown = run([str(PUROKIT), "common"])
    assert unknown.returncode == 2 and "unknown package 'common'" in unknown.stderr
