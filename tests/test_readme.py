"""Every Python snippet of the README runs when pasted alone into a fresh interpreter."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_snippets():
    assert len(SNIPPETS) >= 4


@pytest.mark.usefixtures("default_opencl")
@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet-{i}" for i in range(len(SNIPPETS))])
def test_snippet_runs_alone(code):
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=README.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
