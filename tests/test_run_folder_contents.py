"""A run folder's content is pinned: two small runs (S-LoRA with VTC and its FCFS comparison;
two vLLM-style replicas) write exactly the files, with exactly the content, that they wrote
before the end-to-end speed work (tests/data/small_run_contents.json says which commit made
them). Content, not bytes: tables are compared as read back, JSON as parsed, plots as pixels,
so writer metadata may change but no value may. The folder's status mark (job.json, added
later) is checked apart: it must say completed."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT

REFERENCE = json.loads((ROOT / "tests" / "data" / "small_run_contents.json").read_text())
RUNS = [name for name in REFERENCE if not name.startswith("_")]


def content_digest(path: Path) -> str:
    h = hashlib.sha256()
    if path.suffix == ".parquet":
        h.update(pd.read_parquet(path).to_csv(index=False).encode())
    elif path.suffix == ".json":
        h.update(json.dumps(json.loads(path.read_text()), sort_keys=True).encode())
    elif path.name.endswith((".jsonl", ".jsonl.gz")):
        raw = path.read_bytes()
        for line in (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode().splitlines():
            h.update(json.dumps(json.loads(line), sort_keys=True).encode())
    elif path.suffix == ".csv":
        h.update(pd.read_csv(path).to_csv(index=False).encode())
    elif path.suffix == ".png":
        from matplotlib.image import imread

        h.update(np.ascontiguousarray(imread(path)).tobytes())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def folder_contents(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): content_digest(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log" and p.name != "job.json"
    }


@pytest.mark.integration
@pytest.mark.parametrize("name", RUNS)
def test_a_small_run_writes_the_pinned_files_and_content(name, tmp_path):
    run = REFERENCE[name]
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "from simulator.apps.run.cli import main; main()",
            *run["args"],
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "run" / "job.json").read_text())["status"] == "completed"
    got = folder_contents(tmp_path / "run")
    assert sorted(got) == sorted(run["files"]), "the same files"
    changed = [f for f in got if got[f] != run["files"][f]]
    assert not changed, f"content changed: {changed}"
