"""The run folder's pictures and report.html: the curves they draw follow the run's tables, every
run folder has them, the default run's folder stays under 2 MB, and the page shows every
picture in a real browser (headless Chromium)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import a10g_cost, random_trace
from policies import FCFS
from simulator.engines import ClusterConfig, SLoRAConfig, simulate
from simulator.metrics.fairness import accumulated_service, cumulative_service, served_intervals
from simulator.report.pictures import client_groups, run_pictures, run_title

MB = 1 << 20


def test_cumulative_service_equals_the_windowed_definition():
    """The sorted-events sum gives W_i(0, t) of `accumulated_service` (a requests x times
    overlap matrix), point masses and requests spread over time alike."""
    rng = np.random.default_rng(5)
    n = 300
    start = rng.uniform(0, 100, n)
    length = np.where(rng.random(n) < 0.2, 0.0, rng.uniform(0, 30, n))  # a fifth point masses
    intervals = pd.DataFrame(
        {
            "client": rng.choice(["a", "b", "c"], n),
            "arrival": start,
            "start": start,
            "end": start + length,
            "service": rng.uniform(1, 500, n),
            "demand": 0.0,
            "served": rng.random(n) < 0.9,
        }
    )
    times = np.sort(np.concatenate((rng.uniform(-5, 140, 200), start[:20])))  # at starts too
    got = cumulative_service(intervals, times)
    want = accumulated_service(intervals, times)
    assert list(got.columns) == list(want.columns)
    np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), rtol=1e-9, atol=1e-6)


def test_more_than_eight_clients_are_drawn_as_the_seven_largest_and_the_rest():
    sizes = {f"client{i}": float(i) for i in range(12)}
    groups = client_groups(list(sizes), sizes)
    assert list(groups)[:7] == [f"client{i}" for i in range(5, 12)]  # natural order kept
    assert groups["other 5 clients"] == [f"client{i}" for i in range(5)]
    few = {"b": 1.0, "a10": 2.0, "a2": 3.0}
    assert list(client_groups(list(few), few)) == ["a2", "a10", "b"]


def test_the_curves_follow_the_runs_tables():
    """Cumulative service ends at each client's total, the KV share stays within the pool, the
    batch is the running step's, and the queue counts arrived requests not yet admitted."""
    trace = random_trace(3, 200, 3, 300, 120, rate=4.0)
    timeline = simulate(trace, FCFS(), a10g_cost(), SLoRAConfig(pool_tokens=6000))
    requests, tokens, steps = (
        timeline.requests_frame(),
        timeline.tokens_frame(),
        timeline.steps_frame(),
    )
    summary = {"end_time": timeline.info["end_time"], "pool_tokens": timeline.pool_tokens}
    pictures = run_pictures(requests, steps, summary, "a test run", tokens)

    totals = served_intervals(requests, tokens).groupby("client")["service"].sum()
    last = pictures.cumulative.iloc[-1]
    for client, total in totals.items():
        assert last[client] == pytest.approx(total, rel=1e-9)
    assert np.nanmax(pictures.kv_share) <= 1.0 and np.nanmin(pictures.kv_share) >= 0.0
    for k in range(0, pictures.times.shape[0], 37):
        t = pictures.times[k]
        waiting = ((requests.arrival <= t) & ~(requests.admitted_at <= t)).sum()
        assert pictures.waiting[k] == waiting, t
        started = steps[steps.start <= t]
        batch = started.batch_size.iloc[-1] if len(started) else 0
        assert pictures.running[k] == batch, t


def test_a_steps_file_read_a_row_group_at_a_time_gives_the_tables_curves(tmp_path: Path):
    """A spilled run's pictures read steps.parquet a row group at a time (its steps do not fit
    in memory): on three replicas, with row groups that cut replicas' steps apart and ties of
    starts across groups, the curves equal those of the whole table, value for value."""
    trace = random_trace(4, 300, 3, 300, 120, rate=9.0)
    timeline = simulate(trace, FCFS(), a10g_cost(), SLoRAConfig(pool_tokens=6000), ClusterConfig(3))
    requests, tokens, steps = (
        timeline.requests_frame(),
        timeline.tokens_frame(),
        timeline.steps_frame(),
    )
    assert steps.replica.nunique() == 3
    # a tie of starts across two row groups: the later row must win, as in the table
    # (of the step followed by the longest idle time on its replica: the curves show it)
    following = steps.groupby("replica").start.shift(-1).fillna(np.inf) - steps.start
    tie = steps.iloc[[int(np.argmax(following.to_numpy()))]].assign(kv_used=1, batch_size=1)
    path = tmp_path / "steps.parquet"
    with pq.ParquetWriter(path, pa.Schema.from_pandas(steps, preserve_index=False)) as writer:
        writer.write_table(pa.Table.from_pandas(steps, preserve_index=False), 97)
        writer.write_table(pa.Table.from_pandas(tie, preserve_index=False))
    steps = pd.concat([steps, tie], ignore_index=True)
    summary = {"end_time": timeline.info["end_time"], "pool_tokens": timeline.pool_tokens}
    whole = run_pictures(requests, steps, summary, "whole", tokens)
    parts = run_pictures(requests, path, summary, "parts", tokens)
    assert parts.replicas == whole.replicas == 3
    np.testing.assert_array_equal(parts.times, whole.times)
    np.testing.assert_array_equal(parts.kv_share, whole.kv_share)
    np.testing.assert_array_equal(parts.running, whole.running)
    assert (whole.times >= tie.start.iloc[0]).any()  # the tie's row is shown from its start


def test_a_title_names_the_parts_of_the_run():
    named = {"policy": "vtc", "workload": "vtc_overload", "engine": "slora", "seed": 0}
    assert run_title(named) == "policy=vtc · workload=vtc_overload · engine=slora · seed=0"


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's first command's run: `fairsim` with the built-in default."""
    folder = tmp_path_factory.mktemp("default") / "run"
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "from simulator.apps.run.cli import main; main()",
            f"hydra.run.dir={folder}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder.parent,
    )
    assert res.returncode == 0, res.stderr
    return folder


@pytest.mark.integration
def test_the_default_run_folder_has_its_pictures_and_report_and_stays_under_2_mb(default_run):
    files = {str(p.relative_to(default_run)) for p in default_run.rglob("*") if p.is_file()}
    pictures = {f for f in files if f.endswith(".png")}
    assert {"service_over_time.png", "kv_and_batch.png", "report.html"} <= files
    assert {f"metrics/{m}.png" for m in ("ttfc", "tbc", "tpot", "e2e")} <= pictures
    size = sum(p.stat().st_size for p in default_run.rglob("*") if p.is_file())
    assert size < 2 * MB, f"{size / MB:.2f} MB"
    page = (default_run / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(pictures)  # every one, embedded
    assert "policy=vtc · workload=vtc_overload · engine=slora" in page
    assert "Max Diff (tok/s)" in page and "client1" in page


def _chromium() -> str:
    """A headless Chromium, or skip saying how to get one."""
    for name in (os.environ.get("FAIRSIM_CHROMIUM"), "chromium-headless-shell", "chromium"):
        path = shutil.which(name) if name else None
        if path:
            return path
    pytest.skip(
        "no Chromium here (Debian: apt-get install chromium-headless-shell; or set "
        "FAIRSIM_CHROMIUM): report.html is checked in a browser where one is installed"
    )


@pytest.mark.integration
def test_report_html_shows_every_picture_in_headless_chromium(default_run):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    executable = _chromium()
    pictures = sorted(p for p in default_run.rglob("*.png"))
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto((default_run / "report.html").as_uri(), wait_until="load")
            images = page.evaluate(
                "Array.from(document.images).map(i => ({alt: i.alt, ok: i.complete, "
                "width: i.naturalWidth, height: i.naturalHeight}))"
            )
            heading = page.inner_text("h1")
            links = page.eval_on_selector_all("a", "links => links.map(a => a.href)")
        finally:
            browser.close()
    assert not errors
    assert heading == "fairsim run"
    assert len(images) == len(pictures)
    broken = [i["alt"] for i in images if not (i["ok"] and i["width"] > 100 and i["height"] > 100)]
    assert not broken, f"images that did not load: {broken}"
    linked = {re.sub(r"^file://", "", link) for link in links}
    assert str(default_run / "summary.json") in linked
    assert all(Path(link).exists() for link in linked)


@pytest.mark.integration
def test_pictures_false_draws_no_picture_but_keeps_the_tables_summary_and_report(tmp_path):
    """`pictures=false veeksha_metrics=false` (sweeps, timed experiments): no PNG at all, the
    same tables and summary figures, a report page without images."""
    folder = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-c", "from simulator.apps.run.cli import main; main()",
         "pictures=false", "veeksha_metrics=false", "workload.duration=60", "compare_with=null",
         f"hydra.run.dir={folder}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert not list(folder.rglob("*.png"))
    assert {"requests.parquet", "tokens.parquet", "summary.json", "report.html"} <= {
        p.name for p in folder.iterdir()
    }
    assert "data:image/png" not in (folder / "report.html").read_text()
