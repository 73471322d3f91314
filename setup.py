"""What pyproject.toml cannot say: the wheel (editable or not) carries `purokit-lm-eval.pth`, one line
run at interpreter start that lets lm-eval releases without entry-point model discovery find the
`purokit` model (proxy_eval/lm_eval_plugin.py)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = Path("proxy_eval") / "purokit-lm-eval.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        # an editable wheel is assembled from what the install commands write (install_lib is
        # its root); a regular wheel from build_lib
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        Path(root).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PTH, Path(root) / PTH.name)


setup(cmdclass={"build_py": BuildPyWithPth})
