"""Every notebook under notebooks/ runs in a real Jupyter kernel at CI scale, and its .ipynb is
the stripped twin of its jupytext py:percent source."""

from __future__ import annotations

from pathlib import Path

import pytest

jupytext = pytest.importorskip(
    "jupytext", reason="the notebooks extra: pip install -e '.[notebooks]'"
)
nbclient = pytest.importorskip(
    "nbclient", reason="the notebooks extra: pip install -e '.[notebooks]'"
)
nbformat = pytest.importorskip("nbformat")

from simulator.apps.sweeps.notebook_run import execute  # noqa: E402

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("*.py"))


def test_there_are_notebooks():
    assert SOURCES, f"no jupytext sources in {NOTEBOOKS}"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_ipynb_is_the_stripped_twin_of_its_source(source):
    paired = source.with_suffix(".ipynb")
    assert paired.exists(), f"{paired.name} missing: jupytext --to ipynb {source}"
    nb = nbformat.read(paired, as_version=4)
    want = [(c.cell_type, c.source) for c in jupytext.read(source).cells]
    assert [(c.cell_type, c.source) for c in nb.cells] == want, f"jupytext --sync {source}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "outputs not stripped"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "SCALE" in tagged[0].source


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_runs_at_ci_scale(source, tmp_path):
    nb = execute(source, "ci", workdir=tmp_path, timeout=600)
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.get("output_type") == "error"
    ]
    assert not errors


def test_readme_gallery_images_exist():
    import re

    root = NOTEBOOKS.parent
    images = re.findall(r"\]\((docs/gallery/[\w.-]+\.png)\)", (root / "README.md").read_text())
    assert len(images) >= 8
    missing = [p for p in images if not (root / p).is_file()]
    assert not missing, f"run python docs/make_gallery.py: {missing}"
