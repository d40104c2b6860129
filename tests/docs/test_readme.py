"""Every Python snippet of the README and of the pages under docs/ runs when pasted alone into
a fresh interpreter; the README stays short and every page it links to exists."""

import re
import subprocess
import sys

import pytest

from tests.helpers import DEVICE_PAGES, ROOT, python_snippets

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [
    (page, code)
    for page in PAGES
    if page.stem not in DEVICE_PAGES
    for code in python_snippets(page)
]


def _id(item) -> str:
    page, code = item
    index = [c for p, c in SNIPPETS if p == page].index(code)
    return f"{page.stem}-{index}"


def test_the_readme_is_short_and_has_three_cpu_snippets():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    assert len(re.findall(r"```python\n", text)) == 3
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1)
    assert "pip install" in first_block and "python -m pytest -q" in first_block


def test_every_linked_page_exists():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+?\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).resolve().is_file(), f"{page.name} links {target}"


@pytest.mark.usefixtures("default_opencl")
@pytest.mark.parametrize("item", SNIPPETS, ids=[_id(s) for s in SNIPPETS])
def test_snippet_runs_alone(item):
    _, code = item
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
