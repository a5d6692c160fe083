"""The run folder: the public output contract (documented in docs/outputs.md).

`write_run` writes requests.parquet, tokens.parquet, steps.parquet and summary.json;
`load_run` reads them back into a `RunOutputs`, so notebooks and later analyses never need the
simulator's internals.

A folder says how its run went in `job.json` (`status`: running, completed, failed or
interrupted; a failure adds its error and traceback). Every file is written under a temporary
name and renamed into place, and `completed` is written last, so `load_run` never takes a
failed, interrupted or half-written folder for a finished run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.core.requests import STATUSES
from simulator.core.timeline import Timeline
from simulator.metrics import abandonment, interactions, latency, replicas
from simulator.metrics.fairness import fairness_summary, tick_span
from simulator.metrics.replicas import StepTotals
from simulator.metrics.tiers import tier_summary

FILES = ("requests.parquet", "tokens.parquet", "steps.parquet", "summary.json")
STATUS_FILE = "job.json"
STATUSES_OF_RUNS = ("running", "completed", "failed", "interrupted")


class IncompleteRunError(FileNotFoundError):
    """A folder that holds no finished run (it failed, was interrupted, or is not a run)."""


class MalformedRunError(ValueError):
    """A finished run's tables contradict themselves (e.g. edited by hand, or written by
    another tool): reading on would score data that is not there."""


@dataclass(frozen=True)
class RunOutputs:
    requests: pd.DataFrame
    # None: a run too large to hold them (simulator/report/blockwise.py); read the files
    tokens: pd.DataFrame | None
    steps: pd.DataFrame | None
    summary: dict[str, Any]
    counters: pd.DataFrame | None = None  # counters.parquet, for policies with counters


# top-level keys that change what is printed, not what is run or written: a sweep resumed
# with `progress=false` still skips the jobs it completed
DISPLAY_ONLY_KEYS = ("progress", "console_rows")


def config_digest(config: dict[str, Any]) -> str:
    """A stable hash of the resolved configuration (sorted-key JSON), display-only keys left
    out."""
    kept = {k: v for k, v in config.items() if k not in DISPLAY_ONLY_KEYS}
    blob = json.dumps(kept, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class TokenFacts:
    """What the run summary needs of the tokens table: from the table itself (`of_tables`),
    or gathered a block of requests at a time for a run too large for one table
    (simulator/report/blockwise.py)."""

    count: int  # output tokens
    latency: pd.DataFrame  # latency.per_request_latency
    last_tokens: pd.DataFrame  # request_id, time: each request's last token
    emitted: pd.Series  # output tokens per request_id
    tbt_of: Callable[[np.ndarray], dict[str, float]]  # see latency.latency_table

    @classmethod
    def of_tables(cls, requests: pd.DataFrame, tokens: pd.DataFrame) -> TokenFacts:
        lat = latency.per_request_latency(requests, tokens)
        ids, counts, times = latency.grouped_tokens(tokens)
        last = times[np.cumsum(counts) - 1] if ids.size else times
        return cls(
            count=len(tokens),
            latency=lat,
            last_tokens=pd.DataFrame({"request_id": ids, "time": last}),
            emitted=pd.Series(counts, index=ids),
            tbt_of=latency.tbt_selector(requests, ids, counts, times),
        )


def summarize(
    timeline: Timeline,
    requests: pd.DataFrame,
    tokens: pd.DataFrame | TokenFacts,
    steps: pd.DataFrame | dict[int, StepTotals],
    config: dict[str, Any],
) -> dict[str, Any]:
    """summary.json. `tokens` and `steps`: the tables, or their `TokenFacts` and per-replica
    `StepTotals`."""
    facts = tokens if isinstance(tokens, TokenFacts) else TokenFacts.of_tables(requests, tokens)
    if isinstance(steps, dict):
        totals = steps
        whole = sum(totals.values(), StepTotals(0, 0.0, 0.0, 0.0, 0.0, 0))
    else:
        totals = replicas.step_totals(steps, timeline.pool_tokens)
        whole = StepTotals.of(steps, timeline.pool_tokens)
    counts = requests.status.value_counts()
    throttled = interactions.throttling(requests)
    extra: dict[str, Any] = {}
    if "interaction_id" in requests or "app" in requests:
        end = float(timeline.info.get("end_time") or 0.0)  # type: ignore[arg-type]
        extra["interactions"] = {
            **throttled,
            **interactions.user_experience(requests),
            "per_app": interactions.per_app(requests, max(end, 1e-9)).to_dict("records"),
            "interaction_latency": interactions.interaction_latency(requests),
        }
    if "preemptions" in requests:  # engine=vllm
        extra["vllm"] = replicas.engine_counts(requests)
        moved = {k: v for k, v in timeline.info.items() if k.startswith("cpu_kv_bytes_")}
        if moved:  # a CPU tier
            extra["vllm"]["cpu_tier"] = moved
        used = timeline.info.get("block_size")
        configured = (config.get("engine") or {}).get("block_size")
        if None not in (used, configured) and used != configured:
            extra["vllm"]["block_size"] = used  # grown to hold a recurrent layer's state
    if "slo_class" in requests:  # SLO classes (the gateway's)
        extra["tiers"] = tier_summary(
            requests, facts.last_tokens, total=tick_span(timeline.info.get("end_time"))
        )
    if "fleet" in timeline.info:  # an elastic fleet
        extra["autoscaler"] = replicas.fleet_summary(timeline.info["fleet"], requests)  # type: ignore[arg-type]
    if "prefill_replica" in requests:  # disaggregated pools
        extra["disaggregation"] = replicas.disaggregation(requests)
    if "client_timeout" in requests:  # clients that may give up
        extra["client_timeouts"] = abandonment.client_timeouts(requests)
    if "replica" in requests:  # simulated (a measured run sees no replicas)
        extra["replicas"] = replicas.per_replica(requests, facts.emitted, totals)
    reasons = (
        requests[requests.status != "completed"].groupby(["status", "reason"], observed=True).size()
    )
    return json_safe(
        {
            "config_digest": config_digest(config),
            "config": config,
            "requests": len(requests),
            "status_counts": {s: int(counts.get(s, 0)) for s in STATUSES},
            "reasons": {f"{s}:{r}": int(v) for (s, r), v in reasons.items()},
            "throttled_requests": throttled["throttled_requests"],
            "throttled_interactions": throttled["throttled_interactions"],
            "wasted_tokens": throttled["wasted_tokens"],
            "throughput_tokens_per_s": latency.token_throughput(requests),
            "output_tokens": facts.count,
            "end_time": timeline.info.get("end_time"),
            "steps": whole.steps,
            "kv_utilisation": whole.kv_utilisation(),
            "pool_tokens": timeline.pool_tokens,
            "latency": latency.latency_table(requests, facts.latency, facts.tbt_of),
            "fairness": fairness_summary(
                requests, facts.last_tokens, total=tick_span(timeline.info.get("end_time"))
            ),
            **extra,
        }
    )


RunTables = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]  # requests, tokens, steps


def run_tables(timeline: Timeline) -> RunTables:
    """The run's requests, tokens and steps tables, as the run folder holds them."""
    return timeline.requests_frame(), timeline.tokens_frame(), timeline.steps_frame()


def write_run(
    timeline: Timeline,
    folder: str | Path,
    config: dict[str, Any] | None = None,
    complete: bool = True,
    tables: RunTables | None = None,
) -> RunOutputs:
    """Write the run folder's files (from `tables`, when the caller built them already).
    `complete=False` leaves the folder marked running, for a caller that adds files (and
    rewrites summary.json) before it calls `mark_completed`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    requests, tokens, steps = run_tables(timeline) if tables is None else tables
    mark_running(folder, config_digest(config or {}))
    frames = {"requests": requests, "tokens": tokens, "steps": steps}
    if timeline.counters is not None:
        frames["counters"] = timeline.counters
    # Arrow encodes and compresses without holding the GIL, so one thread writes the files,
    # one after another, while this one computes the summary (a 9,000-request sim-to-real
    # run, whole process: 2.2-2.4 s -> 1.9-2.05 s, peak memory +5-21 MB; a thread per file
    # gained no more and took 25-70 MB more)
    with ThreadPoolExecutor(max_workers=1) as writer:
        written = [
            writer.submit(write_parquet, frame, folder / f"{name}.parquet")
            for name, frame in frames.items()
        ]
        summary = summarize(timeline, requests, tokens, steps, config or {})
        for done in written:
            done.result()  # (a failed write raises here)
    write_summary(summary, folder)
    if complete:
        mark_completed(folder, summary["config_digest"])
    return RunOutputs(requests, tokens, steps, summary, timeline.counters)


PARQUET_ROW_GROUP = 1 << 20  # rows: Arrow's default row group, so small files are unchanged


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """The frame a row group at a time: Arrow copies one row group's columns, not the whole
    frame's (benchmarks/cli_end_to_end.py --workload core, 26M tokens: 520 MB less at the peak).
    The schema is the whole frame's, so that a part whose column is all null keeps its type."""
    with FrameWriter(path) as writer:
        writer.write(frame)


class FrameWriter:
    """Frames appended to one Parquet file, a row group at a time, under the first frame's
    schema; the file appears under its name when the writer closes without an error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None

    def write(self, frame: pd.DataFrame) -> None:
        if self.writer is None:
            self.schema = pa.Schema.from_pandas(frame, preserve_index=False)
            self.writer = pq.ParquetWriter(self.tmp, self.schema)
        for start in range(0, len(frame), PARQUET_ROW_GROUP):
            part = frame.iloc[start : start + PARQUET_ROW_GROUP]
            table = pa.Table.from_pandas(part, schema=self.schema, preserve_index=False)
            self.writer.write_table(table)

    def __enter__(self) -> FrameWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self.writer is None:
            return
        self.writer.close()
        if kind is None:
            self.tmp.replace(self.path)


def write_summary(summary: dict[str, Any], folder: str | Path) -> None:
    write_text_atomically(Path(folder, "summary.json"), json.dumps(summary, indent=2) + "\n")


def write_text_atomically(path: Path, text: str) -> None:
    """Write to a temporary name, then rename: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def read_status(folder: str | Path) -> dict[str, Any] | None:
    """The folder's job.json, or None when it has none (or an unreadable one)."""
    path = Path(folder, STATUS_FILE)
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def mark_status(folder: str | Path, status: str, **fields: Any) -> None:
    if status not in STATUSES_OF_RUNS:
        raise ValueError(f"run status {status!r} is not one of {STATUSES_OF_RUNS}")
    Path(folder).mkdir(parents=True, exist_ok=True)
    text = json.dumps({"status": status, **fields}, indent=2) + "\n"
    write_text_atomically(Path(folder, STATUS_FILE), text)


def mark_running(folder: str | Path, digest: str) -> None:
    """The run has started in this process: its pid and host let a sweep tell a job whose
    worker has gone (`mark_orphaned_jobs`) from one still running."""
    mark_status(folder, "running", config_digest=digest, pid=os.getpid(), host=socket.gethostname())


def mark_orphaned_jobs(folder: str | Path, signal_name: str) -> list[Path]:
    """Mark `interrupted` every run under `folder` whose job.json still says running but whose
    process, on this host, has ended: a launcher that stops its workers on SIGINT/SIGTERM (joblib
    kills them) can do so before a worker marks its own folder. Runs on other hosts, or whose
    process still exists, are left as they are. Returns the folders marked."""
    marked = []
    host = socket.gethostname()
    for path in sorted(Path(folder).glob(f"**/{STATUS_FILE}")):
        status = read_status(path.parent) or {}
        pid = status.get("pid")
        if status.get("status") != "running" or status.get("host") != host:
            continue
        if not isinstance(pid, int) or _process_exists(pid):
            continue
        fields = {k: v for k, v in status.items() if k not in ("status", "pid", "host")}
        mark_status(path.parent, "interrupted", **fields, signal=signal_name, worker_pid=pid)
        marked.append(path.parent)
    return marked


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def mark_completed(folder: str | Path, digest: str) -> None:
    mark_status(folder, "completed", config_digest=digest)


def is_completed(folder: str | Path, digest: str | None = None) -> bool:
    """The folder's run finished (for this configuration digest, when one is given)."""
    status = read_status(folder) or {}
    same = digest is None or status.get("config_digest") == digest
    return status.get("status") == "completed" and same


def load_run(folder: str | Path) -> RunOutputs:
    """Read a finished run's folder back; refuses a folder whose run did not finish."""
    folder = Path(folder)
    missing = [f for f in FILES if not (folder / f).exists()]
    status = read_status(folder)
    if status is None and missing:
        raise IncompleteRunError(f"{folder}: not a fairsim run folder (missing {missing})")
    if status is None or status.get("status") != "completed":
        state = "has no completion mark" if status is None else f"is {status.get('status')}"
        error = f": {status['error']}" if status and status.get("error") else ""
        raise IncompleteRunError(f"{folder}: the run {state}{error}; it holds no finished run")
    if missing:
        raise IncompleteRunError(f"{folder}: marked completed but {missing} are missing")
    requests = pd.read_parquet(folder / "requests.parquet")
    tokens = pd.read_parquet(folder / "tokens.parquet")
    check_token_table(tokens, requests, folder / "tokens.parquet")
    return RunOutputs(
        requests=requests,
        tokens=tokens,
        steps=pd.read_parquet(folder / "steps.parquet"),
        summary=json.loads((folder / "summary.json").read_text()),
        counters=(
            pd.read_parquet(folder / "counters.parquet")
            if (folder / "counters.parquet").exists()
            else None
        ),
    )


def check_token_table(tokens: pd.DataFrame, requests: pd.DataFrame, path: Path) -> None:
    """Refuse a token table that cannot be scored, naming its first bad row: a time that is
    no finite number, a token recorded twice, a token of no request in the run."""
    time = pd.to_numeric(tokens["time"], errors="coerce").to_numpy(dtype=np.float64)
    problems = (
        (~np.isfinite(time), "time is not a finite number"),
        (tokens.duplicated(["request_id", "index"]).to_numpy(), "the token is recorded twice"),
        (~tokens["request_id"].isin(requests["request_id"]).to_numpy(), "no such request"),
    )
    for bad, why in problems:
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            request, index = tokens["request_id"].iloc[row], tokens["index"].iloc[row]
            raise MalformedRunError(
                f"{path}: row {row} (request_id {request}, index {index}): {why} "
                f"({int(bad.sum())} such rows); each token of a request in requests.parquet "
                "is recorded once, with its time in seconds"
            )


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN/inf become null (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
