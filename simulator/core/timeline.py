"""What a run produced: per-request facts, per-step records and the per-token timeline.

Steps are recorded by one `StepRecorder` per replica, a run of equal steps at a time. Tokens are
stored in one encoding, `TokenRuns`: a run is (row, index, count, tick), meaning tokens
`index .. index + count - 1` of request `row` were emitted at ticks `tick .. tick + count - 1`
of its replica's *token clock*, an array of times the step model defines (vLLM-style: every
step's end; S-LoRA: its decode steps' ends, then its prefill steps' ends, because a running
request takes part in every decode step). The timeline expands runs to one row per token on
demand.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.core.counters import SPILL_FORMAT, CounterLog
from simulator.core.requests import STATUSES
from traces.schema import OPTIONAL_INT_COLUMNS, SLO_CLASSES, Trace

STEP_KINDS = ("prefill", "decode", "mixed")  # mixed: chunked prefill next to decodes (vLLM)
PREFILL, DECODE, MIXED = range(len(STEP_KINDS))
STEP_COLUMNS = ("start", "end", "kind", "batch_size", "num_tokens", "kv_used", "preempted")


class StepRecorder:
    """Per-step records of one replica, appended a run of equal steps at a time.

    A run of k steps is its first start, its k end times and KV in use after each, and (kind,
    batch size, tokens per step, preemptions); step j of a run starts when step j - 1 ends.
    After `spill_to`, every `limit` steps are written to a Parquet file as a row group and let
    go of, their ends and kinds (the token clock is made of them) to two raw files beside it,
    which `clock_columns` maps back (a day of 64 replicas records about 200M steps: 1.8 GB of
    ends that stay on disk until read).
    """

    def __init__(self) -> None:
        self._ends = array("d")
        self._kinds = array("b")
        self._kv = array("q")
        self.last_kv = 0  # KV in use after the last step recorded (what a replica reports)
        # per run: its first start, and (steps, kind, batch size, tokens, preemptions) as int32:
        # 28 bytes a run where six doubles took 48 (an overload run records a run per step)
        self._starts = array("d")
        self._runs = array("i")
        self._written = 0  # steps written to the spill file; the buffers hold those after them
        self._closed = False
        self._clock_taken = False  # `take_clock_columns` was called: ends and kinds are gone
        self._spill: Path | None = None
        self._limit = 0
        self._writer: pq.ParquetWriter | None = None

    def __len__(self) -> int:
        return self._written + len(self._ends)

    @property
    def ends(self) -> array:
        """Every step's end so far, in order (read only: a live run reads token times here)."""
        if self._spill is not None:
            raise RuntimeError("these steps' ends were written to disk (see spill_to)")
        return self._ends

    def _clock_files(self) -> tuple[Path, Path]:
        assert self._spill is not None
        return self._spill.with_name(self._spill.name + ".ends"), self._spill.with_name(
            self._spill.name + ".kinds"
        )

    def spill_to(self, path: Path, limit: int) -> None:
        """From now on, write the records to `path` whenever `limit` steps are buffered."""
        if limit < 1:
            raise ValueError(f"spill limit must be >= 1 step, got {limit}")
        self._spill, self._limit = path, limit

    def spill_file(self) -> Path:
        """The file holding every step, once `close` has written the last ones."""
        if self._spill is None or self._writer is None:
            raise RuntimeError("these steps were not spilled (see spill_to)")
        return self._spill

    def record(
        self,
        start: float,
        ends: list[float] | np.ndarray,
        kv: list[int] | range,
        kind: int,
        batch_size: int,
        num_tokens: int,
        preempted: int = 0,
    ) -> None:
        if isinstance(ends, np.ndarray):
            self._ends.frombytes(ends.tobytes())
        else:
            self._ends.extend(ends)
        self._kv.extend(kv)
        if len(kv):
            self.last_kv = int(kv[-1])
        self._kinds.frombytes(bytes([kind]) * len(kv))
        self._starts.append(start)
        self._runs.extend((len(kv), kind, batch_size, num_tokens, preempted))
        if self._spill is not None and len(self._kv) >= self._limit:
            self._write()

    def _write(self) -> None:
        assert self._spill is not None
        table = pa.table(self._buffered())
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._spill, table.schema, **SPILL_FORMAT)
        self._writer.write_table(table)
        ends, kinds = self._clock_files()
        with ends.open("ab") as f:
            self._ends.tofile(f)
        with kinds.open("ab") as f:
            self._kinds.tofile(f)
        self._written += len(self._ends)
        for buffer in (self._ends, self._kinds, self._kv, self._starts, self._runs):
            del buffer[:]

    def close(self) -> None:
        """After `spill_to`: write the last buffered steps and close the file (`spill_file`)."""
        if self._spill is not None and not self._closed:
            self._write()
            assert self._writer is not None
            self._writer.close()
        self._closed = True

    def clock_columns(self) -> dict[str, np.ndarray]:
        """Every step's end and kind (index STEP_KINDS); spilled, mapped from their files
        (read only) once `close` has written the last."""
        if self._clock_taken:
            raise RuntimeError("the step clock was handed over (take_clock_columns)")
        if self._spill is None:
            return {
                "end": np.frombuffer(self._ends, dtype=np.float64),
                "kind": np.frombuffer(self._kinds, dtype=np.int8),
            }
        if not self._closed:
            raise RuntimeError("the step clock of spilled steps is read after close")
        ends, kinds = self._clock_files()
        if not self._written:  # (a file of no bytes cannot be mapped)
            return {"end": np.empty(0), "kind": np.empty(0, dtype=np.int8)}
        return {
            "end": np.memmap(ends, dtype=np.float64, mode="r", shape=(self._written,)),
            "kind": np.memmap(kinds, dtype=np.int8, mode="r", shape=(self._written,)),
        }

    def take_clock_columns(self) -> dict[str, np.ndarray]:
        """`clock_columns` once the run is over, the recorder keeping no reference to them: when
        the caller lets go of them, their memory goes (9 bytes a step)."""
        columns = self.clock_columns()
        self._ends, self._kinds, self._clock_taken = array("d"), array("b"), True
        return columns

    def columns(self) -> dict[str, np.ndarray]:
        """One entry per step (see STEP_COLUMNS; kinds index STEP_KINDS)."""
        if self._writer is not None:
            raise RuntimeError("the steps were written to their spill file; read them there")
        return self._buffered()

    def _buffered(self) -> dict[str, np.ndarray]:
        end = np.frombuffer(self._ends, dtype=np.float64).copy()
        runs = np.frombuffer(self._runs, dtype=np.int32).reshape(-1, 5)
        k = runs[:, 0].astype(np.int64)
        start = np.empty_like(end)  # a step starts when the one before ends, or its run starts
        start[1:] = end[:-1]
        start[np.cumsum(k) - k] = np.frombuffer(self._starts, dtype=np.float64)
        return {
            "start": start,
            "end": end,
            "kind": np.repeat(runs[:, 1].astype(np.int8), k),
            "batch_size": np.repeat(runs[:, 2].astype(np.int64), k),
            "num_tokens": np.repeat(runs[:, 3].astype(np.int64), k),
            "kv_used": np.frombuffer(self._kv, dtype=np.int64).copy(),
            "preempted": np.repeat(runs[:, 4].astype(np.int64), k),
        }


@dataclass(frozen=True)
class SpillPlan:
    """A run too large to keep its step records in memory writes them to `folder`, every
    `steps` steps of a replica (simulator/engines/runner.py)."""

    folder: Path
    steps: int


class TokenRuns:
    """Runs of consecutive tokens of a request, each on consecutive ticks of one replica's token
    clock. A step model either opens a run when a request starts (or resumes) emitting and
    closes it when it stops, or adds whole runs at once."""

    NAMES = ("row", "index", "count", "replica", "tick")

    def __init__(self) -> None:
        self._open: dict[int, tuple[int, int, int]] = {}  # row -> (index, replica, tick)
        # closed runs, five numbers each in NAMES order: 40 bytes a run where a tuple of five
        # ints took about 150 (a day of 64 replicas closes millions of runs)
        self._closed = array("q")
        self._added: list[dict[str, np.ndarray]] = []

    def open(self, req: int, index: int, replica: int, tick: int) -> None:
        """`req` emits token `index` at `tick` and keeps emitting one per tick (unless open)."""
        if req not in self._open:
            self._open[req] = (index, replica, tick)

    def close(self, req: int, generated: int) -> None:
        """`req` stops emitting, having emitted `generated` tokens in all (no-op if not open;
        a run that emitted nothing is left out)."""
        run = self._open.pop(req, None)
        if run is not None and generated > run[0]:
            index, replica, tick = run
            self._closed.extend((req, index, generated - index, replica, tick))

    def open_run(self, req: int) -> tuple[int, int, int] | None:
        """(first index, replica, tick) of the run `req` is emitting now, if any."""
        return self._open.get(req)

    def closed_since(self, start: int) -> list[tuple[int, int, int, int, int]]:
        """The runs closed after the first `start` (row, index, count, replica, tick)."""
        flat = self._closed[len(self.NAMES) * start :]
        return list(zip(flat[0::5], flat[1::5], flat[2::5], flat[3::5], flat[4::5], strict=True))

    def close_all(self, generated: list[int]) -> None:
        for req in list(self._open):
            self.close(req, generated[req])

    def add(
        self, rows: np.ndarray, index: np.ndarray, count: np.ndarray, replica: int, tick: np.ndarray
    ) -> None:
        """Whole runs at once (empty runs are left out)."""
        keep = count > 0
        self._added.append(
            {
                "row": rows[keep],
                "index": index[keep],
                "count": count[keep],
                "replica": np.full(int(keep.sum()), replica, dtype=np.int64),
                "tick": tick[keep],
            }
        )

    def absorb(self, other: TokenRuns) -> None:
        """Add the runs `other` closed or added (replicas simulated apart; readers sort runs,
        so their order does not matter)."""
        if other._open:
            raise ValueError("TokenRuns.absorb: the other runs are not all closed")
        self._closed += other._closed
        self._added += other._added

    def columns(self, clock_offsets: np.ndarray) -> dict[str, np.ndarray]:
        """Runs as columns row, index, count, tick, with ticks into the concatenated clocks
        (replica r's clock starts at `clock_offsets[r]`)."""
        closed = np.frombuffer(self._closed, dtype=np.int64).reshape(-1, len(self.NAMES))
        parts = [dict(zip(self.NAMES, closed.T, strict=True)), *self._added]
        cols = {n: np.concatenate([p[n] for p in parts]) for n in self.NAMES}
        return {
            "row": cols["row"],
            "index": cols["index"],
            "count": cols["count"],
            "tick": cols["tick"] + clock_offsets[cols["replica"]],
        }


@dataclass(eq=False)
class Timeline:
    """The result of one run over `trace` (rows align with the trace's rows)."""

    trace: Trace
    arrival: np.ndarray  # when each request arrived (NaN: never; chained calls differ from trace)
    status: np.ndarray  # int8 codes into STATUSES
    reason: np.ndarray  # object: str or None
    admitted_at: np.ndarray
    first_token_at: np.ndarray
    finished_at: np.ndarray
    generated: np.ndarray  # output tokens emitted
    steps: dict[str, np.ndarray]  # STEP_COLUMNS plus `replica` (empty when in step_files)
    token_runs: dict[str, np.ndarray]  # row, index, count, tick (see TokenRuns)
    token_clock: np.ndarray  # every replica's token clock, concatenated
    pool_tokens: int
    info: dict[str, object] = field(default_factory=dict)
    counters: pd.DataFrame | None = None  # the policy's counter events (core/counters.py)
    request_columns: dict[str, np.ndarray] = field(default_factory=dict)  # replica, preemptions
    # a spilled run (SpillPlan): its steps, one Parquet file per replica in replica order, and
    # its counter logs in place of `counters`, one per policy (one per replica unless shared)
    step_files: list[Path] | None = None
    counter_logs: list[CounterLog] | None = None

    TOKEN_BLOCK = 1 << 20  # tokens per block when expanding the per-token timeline

    def sorted_token_runs(self) -> dict[str, np.ndarray]:
        """The token runs by row, then index: each row's tokens in order, rows in order."""
        runs = self.token_runs
        order = np.lexsort((runs["index"], runs["row"]))
        order = order[runs["count"][order] > 0]  # a run closed before its first token
        return {k: runs[k][order] for k in ("row", "index", "tick", "count")}

    def last_tokens(self) -> pd.DataFrame:
        """request_id, time and count of tokens of each request that emitted any: its last
        token without the per-token table (the fairness figures need no more)."""
        runs = self.sorted_token_runs()
        row = runs["row"]
        last = np.flatnonzero(np.append(row[1:] != row[:-1], True)) if row.size else row
        tick = runs["tick"][last] + runs["count"][last] - 1
        emitted = np.bincount(row, weights=runs["count"], minlength=len(self.trace))
        return pd.DataFrame(
            {
                "request_id": self.trace.request_id[row[last]],
                "time": self.token_clock[tick],
                "tokens": emitted[row[last]].astype(np.int64),
            }
        )

    def token_times(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, index, time) of every emitted output token, grouped by row, index 0 first.

        Rows and indices are int32 to keep tens of millions of tokens compact; the arrays are
        filled a block of runs at a time so that no full-length temporaries are needed.
        """
        return self._expand(self.sorted_token_runs())

    def token_blocks(self, max_tokens: int) -> Iterator[tuple[slice, pd.DataFrame]]:
        """`tokens_frame` a block of consecutive rows at a time: (rows, their tokens), each
        block holding at most `max_tokens` tokens (a row holding more is a block alone), so
        that a run too large for one frame is written and scored in bounded memory."""
        runs = self.sorted_token_runs()
        n = len(self.trace)
        per_row = np.bincount(runs["row"], weights=runs["count"], minlength=n).astype(np.int64)
        ends = np.cumsum(per_row)
        lo = first_run = 0
        if n == 0:
            yield slice(0, 0), self._frame(*self._expand(runs))
        while lo < n:
            base = int(ends[lo] - per_row[lo])
            hi = max(lo + 1, int(np.searchsorted(ends, base + max_tokens, side="right")))
            last_run = int(np.searchsorted(runs["row"], hi, side="left"))
            part = {k: v[first_run:last_run] for k, v in runs.items()}
            yield slice(lo, hi), self._frame(*self._expand(part))
            lo, first_run = hi, last_run

    def _expand(self, runs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, index, time) of every token of `runs` (sorted by row, then index)."""
        row, first, tick, count = (runs[k] for k in ("row", "index", "tick", "count"))
        total = int(count.sum())
        rows = np.repeat(row.astype(np.int32), count)
        index = np.empty(total, dtype=np.int32)
        time = np.empty(total)
        starts = np.cumsum(count) - count
        # within a run, a token's tick minus its index is constant: index = place in the block
        # minus (run start - first index), tick = index + (tick - first index)
        shift = (starts - first).astype(np.int64)
        offset = (tick - first).astype(np.int32)  # ticks and indices fit int32
        bounds = np.searchsorted(starts, np.arange(0, max(total, 1), self.TOKEN_BLOCK))
        for lo, hi in zip(bounds.tolist(), [*bounds[1:].tolist(), count.shape[0]], strict=True):
            if lo == hi:
                continue
            cs = count[lo:hi]
            a = int(starts[lo])
            b = a + int(cs.sum())
            # int32 within a block: it holds at most TOKEN_BLOCK tokens
            local = (shift[lo:hi] - a).astype(np.int32)
            np.subtract(np.arange(b - a, dtype=np.int32), np.repeat(local, cs), out=index[a:b])
            self.token_clock.take(index[a:b] + np.repeat(offset[lo:hi], cs), out=time[a:b])
        return rows, index, time

    def requests_frame(self) -> pd.DataFrame:
        """One row per request; a trace's optional columns (interactions, think times) follow."""
        t = self.trace
        optional: dict[str, object] = {}
        if t.app is not None:  # users belong to apps (FairServe): the client is the user
            optional["app"] = pd.Categorical.from_codes(t.app, categories=list(t.app_names))
            optional["user"] = pd.Categorical.from_codes(t.client, categories=list(t.client_names))
        for name in (*OPTIONAL_INT_COLUMNS, "think_time", "client_timeout"):
            if getattr(t, name) is not None:
                optional[name] = getattr(t, name)
        if t.slo_class is not None:
            optional["slo_class"] = pd.Categorical.from_codes(t.slo_class, categories=SLO_CLASSES)
        return pd.DataFrame(
            {
                "request_id": t.request_id,
                "client": pd.Categorical.from_codes(t.client, categories=list(t.client_names)),
                "arrival": self.arrival,
                "prompt_len": t.prompt_len,
                "output_len": t.output_len,
                "status": pd.Categorical.from_codes(self.status, categories=list(STATUSES)),
                "reason": pd.array(self.reason, dtype="string"),
                "admitted_at": self.admitted_at,
                "first_token_at": self.first_token_at,
                "finished_at": self.finished_at,
                "tokens_emitted": self.generated,
                **self.request_columns,
                **optional,
            }
        )

    def tokens_frame(self) -> pd.DataFrame:
        return self._frame(*self.token_times())

    def _frame(self, rows: np.ndarray, index: np.ndarray, time: np.ndarray) -> pd.DataFrame:
        # the columns are fresh arrays that nothing else holds: no copy (76 MB less at 4M tokens)
        return pd.DataFrame(
            {"request_id": self.trace.request_id[rows], "index": index, "time": time}, copy=False
        )

    def steps_frame(self) -> pd.DataFrame:
        if self.step_files is not None:
            raise RuntimeError("this run's steps were spilled to step_files; read them there")
        s = dict(self.steps)
        s["kind"] = pd.Categorical.from_codes(s["kind"], categories=list(STEP_KINDS))
        return pd.DataFrame(s)
