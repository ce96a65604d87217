"""The Python sources pass ruff with the project's configuration (pyproject.toml [tool.ruff]:
pycodestyle errors and warnings, pyflakes, 120 columns)."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHS = ("rawops", "tests", "bench", "dev", "_build", "setup.py")


def _ruff():
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    return [found] if found else None


RUFF = _ruff()


@pytest.mark.skipif(RUFF is None, reason="ruff not installed: pip install ruff (the test extra has it)")
@pytest.mark.skipif(not os.path.isfile(os.path.join(REPO, "pyproject.toml")), reason="not a source checkout")
def test_the_python_sources_pass_ruff():
    paths = [p for p in PATHS if os.path.exists(os.path.join(REPO, p))]
    done = subprocess.run([*RUFF, "check", "--no-cache", "--output-format", "concise", *paths],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ruff check {' '.join(paths)}:\n{done.stdout}{done.stderr}"
