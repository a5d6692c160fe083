"""A run too large to hold its per-token table, written and scored a block of requests at a time.

A million requests emit about 260M tokens: one float per token is 2 GB. Such a run records its
steps and counter events to disk as it goes (`SpillPlan`); here the tokens table is made a block
of consecutive requests at a time (`Timeline.token_blocks`). Each block is appended to
tokens.parquet and to request_level_metrics.jsonl.gz and scored: every per-request figure
(latency, fluidity, Andes QoE, the fluid rate's deadlines, the deadline-miss rates) is the same
in a block as in the whole table. Pooled inter-token gaps come from the token clock
(simulator/metrics/pooled.py), steps from their files a row group at a time.

The run folder holds the same files with the same values as `write_run` and the Veeksha
writers give; a mean summed block by block may differ in its last digit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from simulator.core.timeline import STEP_KINDS, Timeline
from simulator.metrics import fluidity, latency
from simulator.metrics.pooled import PooledGaps, WeightedValues
from simulator.metrics.prefill_curve import PrefillCurve
from simulator.metrics.qoe import QoEConfig, qoe_block, request_fluidity
from simulator.metrics.replicas import StepTotals
from simulator.metrics.slo import SLO, evaluate_slos
from simulator.report.background import Worker
from simulator.report.run_folder import (
    FrameWriter,
    RunOutputs,
    TokenFacts,
    config_digest,
    json_safe,
    mark_running,
    summarize,
    write_parquet,
    write_summary,
)
from simulator.report.veeksha import (
    MISS_CURVE_FILE,
    REQUEST_ROWS_FILE,
    request_level_columns,
    write_distributions,
    write_request_level_metrics,
    write_veeksha_summaries,
)


@dataclass(frozen=True)
class QoESetup:
    """What the QoE summary and the Veeksha files of a run need besides its tables."""

    config: QoEConfig
    curve: PrefillCurve | None  # the prefill-time curve behind Etalon's TTFT deadline
    slos: list[SLO]
    configured_rate: float | None  # the workload's arrival rate, for Veeksha's health check
    veeksha: bool  # write the Veeksha-compatible files under metrics/
    title: str = ""  # names the run on its plots (simulator/report/pictures.py: run_title)


def write_run_in_blocks(
    timeline: Timeline,
    folder: str | Path,
    config: dict[str, Any],
    max_tokens: int,
    qoe: QoESetup | None = None,
    plots: Worker | None = None,
) -> RunOutputs:
    """The run folder of a spilled run (`timeline.step_files` set), its tokens at most
    `max_tokens` at a time. The folder is left marked running, as `write_run(complete=False)`
    leaves it; the returned outputs hold no tokens or steps table (read the files). With the
    Veeksha files asked for, `plots` (a `Worker` of `prepare_plots`) writes the request rows
    and the distributions meanwhile (the caller waits for its `results`)."""
    if timeline.step_files is None:
        raise ValueError("write_run_in_blocks: the run was not spilled (see SpillPlan)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mark_running(folder, config_digest(config))
    requests = timeline.requests_frame()
    write_parquet(requests, folder / "requests.parquet")
    totals = _write_steps(timeline.step_files, folder / "steps.parquet", timeline.pool_tokens)
    _write_counters(timeline, folder / "counters.parquet")
    scores = _Scores(requests, qoe, folder / "metrics", plots)
    with FrameWriter(folder / "tokens.parquet") as tokens_file:
        for rows, tokens in timeline.token_blocks(max_tokens):
            tokens_file.write(tokens)
            scores.add(requests.iloc[rows], tokens)
            del tokens  # before the next block is made: one block in memory at a time
    pool = PooledGaps(timeline)
    last = timeline.last_tokens()
    facts = TokenFacts(
        count=int(last.tokens.sum()),
        latency=pd.concat(scores.latency),
        last_tokens=last[["request_id", "time"]],
        emitted=pd.Series(last.tokens.to_numpy(), index=last.request_id.to_numpy()),
        tbt_of=lambda rows: pool.of(rows).summary(latency.PERCENTILES),
    )
    summary = summarize(timeline, requests, facts, totals, config)
    if qoe is not None:
        completed = (requests.status == "completed").to_numpy()
        prefilled = sum(t.prefill_tokens for t in totals.values())
        summary.update(scores.finish(requests, pool.of(completed), prefilled))
    write_summary(summary, folder)
    return RunOutputs(requests, None, None, summary, None)


class _Scores:
    """The per-request figures of every block, and the QoE files written as blocks come."""

    def __init__(
        self, requests: pd.DataFrame, qoe: QoESetup | None, metrics: Path, plots: Worker | None
    ) -> None:
        self.qoe, self.metrics = qoe, metrics
        if qoe is not None and qoe.veeksha and plots is None:
            raise ValueError("write_run_in_blocks: the Veeksha files are written by a Worker")
        self.plots = plots
        self.latency: list[pd.DataFrame] = []  # per_request_latency, convention vllm
        self.fluidity: list[pd.DataFrame] = []
        self.veeksha_latency: list[pd.DataFrame] = []  # completed requests, convention veeksha
        self.andes: list[np.ndarray] = []
        self.deadlines: list[np.ndarray] = []  # the fluid rate's per-request deadlines
        self.prompt: list[np.ndarray] = []
        self.ttfc: list[np.ndarray] = []
        self.completed = 0
        self.curve: fluidity.MissRateCurve | None = None
        if qoe is not None and qoe.veeksha:
            metrics.mkdir(parents=True, exist_ok=True)
            (metrics / REQUEST_ROWS_FILE).write_bytes(b"")
            done = (requests.status == "completed") & (requests.tokens_emitted > 0)
            self.curve = fluidity.MissRateCurve(int(done.sum()), exact=qoe.config.exact)

    def add(self, requests: pd.DataFrame, tokens: pd.DataFrame) -> None:
        self.latency.append(latency.per_request_latency(requests, tokens))
        if self.qoe is None:
            return
        cfg, curve = self.qoe.config, self.qoe.curve
        done = requests[requests.status == "completed"]
        done_tokens = latency.tokens_of(tokens, done.request_id)
        flu = request_fluidity(requests, tokens, cfg, curve)
        self.fluidity.append(flu)
        self.veeksha_latency.append(latency.per_request_latency(done, done_tokens, "veeksha"))
        self.andes.append(
            latency.andes_qoe(
                requests, done_tokens, cfg.expected_ttft, cfg.reading_speed
            ).to_numpy()
        )
        decode = latency.inter_token_gaps(requests, tokens)[1].drop_first()
        self.deadlines.append(fluidity.fluid_rate_deadlines(decode, cfg.exact))
        if self.curve is None:
            return
        self.curve.add(decode)
        columns = request_level_columns(requests, tokens, cfg, curve, flu)
        assert self.plots is not None
        # the child compresses the rows while this process makes and scores the next block
        # (a one-day 2-replica fleet run, docs/gateway.md: writing 14.1 -> 11.5 s); one
        # block's rows wait at most, so that what waits in shared memory stays bounded
        self.plots.catch_up(1)
        self.plots.submit(
            write_request_level_metrics, self.metrics / REQUEST_ROWS_FILE, columns, decode, True
        )
        self.completed += len(columns["request_id"])
        self.prompt.append(columns["num_delta_prompt_tokens"])
        self.ttfc.append(columns["ttfc"])

    def finish(self, requests: pd.DataFrame, tbc: WeightedValues, prefilled: int) -> dict[str, Any]:
        """The summary's `qoe` and `slo_results`, and the Veeksha files other than the rows."""
        assert self.qoe is not None
        cfg = self.qoe.config
        flu = pd.concat(self.fluidity)
        lat = pd.concat(self.veeksha_latency)
        limits = (cfg.goodput_ttft, cfg.goodput_tpot, cfg.goodput_e2e)
        given = any(v is not None for v in limits)
        good = latency.goodput_of(requests, lat, *limits) if given else None
        rate = fluidity.rate_of_deadlines(np.concatenate(self.deadlines))
        block = qoe_block(cfg, self.qoe.curve, flu, rate, np.concatenate(self.andes), good)
        values = {
            "ttfc": lat.ttft.to_numpy(),
            "tbc": tbc,
            "tpot": lat.tpot.to_numpy(),
            "e2e": lat.e2e.to_numpy(),
            "normalized_e2e": lat.normalized_e2e.to_numpy(),
            "fluidity": flu.fluidity.to_numpy(),
            "miss_rate": flu.miss_rate.to_numpy(),
        }
        if self.curve is None:
            results = evaluate_slos(self.qoe.slos, values)
        else:
            results = write_veeksha_summaries(
                self.metrics,
                requests,
                self.completed,
                values,
                rate,
                np.concatenate(self.prompt),
                np.concatenate(self.ttfc),
                prefilled,
                self.qoe.slos,
                self.qoe.configured_rate,
            )
            self.curve.frame().to_csv(self.metrics / MISS_CURVE_FILE, index=False)
            assert self.plots is not None
            self.plots.submit(write_distributions, self.metrics, values, None, self.qoe.title)
        return {"qoe": json_safe(block), "slo_results": json_safe(results)}


def _write_steps(files: list[Path], path: Path, pool_tokens: int) -> dict[int, StepTotals]:
    """steps.parquet from each replica's spill file, a row group at a time (the files are
    removed); returns each replica's StepTotals."""
    totals: dict[int, StepTotals] = {}
    with FrameWriter(path) as writer:
        for replica, file in enumerate(files):
            parts = pq.ParquetFile(file)
            for i in range(parts.num_row_groups):
                steps = parts.read_row_group(i).to_pandas()
                steps["kind"] = pd.Categorical.from_codes(steps["kind"], categories=STEP_KINDS)
                steps["replica"] = np.full(len(steps), replica, dtype=np.int64)
                if len(steps):
                    part = StepTotals.of(steps, pool_tokens)
                    totals[replica] = totals[replica] + part if replica in totals else part
                writer.write(steps)
            file.unlink()
    return totals


def _write_counters(timeline: Timeline, path: Path) -> None:
    logs = timeline.counter_logs
    if logs is None:
        return
    names = list(timeline.trace.client_names)
    with FrameWriter(path) as writer:
        for replica, log in enumerate(logs):
            if len(logs) > 1:  # as the in-memory runner labels them
                log.write_sorted(names, _with_replica(writer, replica))
            else:
                log.write_sorted(names, writer.write)


def _with_replica(writer: FrameWriter, replica: int) -> Callable[[pd.DataFrame], None]:
    return lambda frame: writer.write(frame.assign(replica=replica))
