"""Execute a notebook's jupytext source at a chosen scale (needs the `notebooks` extra).

Every notebook under notebooks/ has one cell tagged `parameters` that sets `SCALE`; a cell
setting the chosen scale is inserted after it, so the notebook itself stays unchanged. Used by
docs/make_gallery.py (full scale) and the notebook tests (CI scale).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator.core.errors import ConfigError


def execute(source: Path, scale: str, workdir: Path | None = None, timeout: int = 1800) -> Any:
    """The executed notebook (an nbformat NotebookNode); raises CellExecutionError naming the
    failing cell."""
    import jupytext
    import nbclient
    import nbformat

    nb = jupytext.read(source)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    at = next((i for i, t in enumerate(tags) if "parameters" in t), None)
    if at is None:
        raise ConfigError(f"{source}: no cell tagged 'parameters' (where SCALE is set)")
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(f"SCALE = {scale!r}  # injected"))
    resources = {"metadata": {"path": str(workdir)}} if workdir is not None else {}
    nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources=resources
    ).execute()
    return nb
