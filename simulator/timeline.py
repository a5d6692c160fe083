"""What a run produced: per-request facts, per-step records and the per-token timeline.

Per-token times are stored compactly and expanded on demand: a request's first token is produced
by its prefill step and every later token by one decode step, and a running request takes part in
every decode step until it finishes. So its tokens are `first_token_at` followed by the end times
of `generated - 1` consecutive decode steps starting at decode step `first_decode`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import pandas as pd

from traces.schema import OPTIONAL_INT_COLUMNS, Trace

STATUSES = ("completed", "rejected", "refused", "in_flight")
COMPLETED, REJECTED, REFUSED, IN_FLIGHT = range(4)
STEP_KINDS = ("prefill", "decode", "mixed")  # mixed: chunked prefill next to decodes (vLLM)
PREFILL, DECODE, MIXED = range(3)


class StepLog:
    """Per-step records, appended one run of equal-sized steps at a time, expanded once at the end.

    A run of k steps is stored as its start time, its k end times, and (kind, batch size, tokens
    per step, KV in use after the first step, KV added per step); step j of the run starts when
    step j - 1 ends.
    """

    NAMES = ("start", "end", "kind", "batch_size", "num_tokens", "kv_used")

    def __init__(self) -> None:
        self._ends: list[list[float]] = []
        self._runs: list[tuple[float, int, int, int, int, int, int]] = []

    def append_run(
        self,
        start: float,
        ends: list[float],
        kind: int,
        batch_size: int,
        num_tokens: int,
        kv_first: int,
        kv_step: int,
    ) -> None:
        self._ends.append(ends)
        self._runs.append((start, len(ends), kind, batch_size, num_tokens, kv_first, kv_step))

    def columns(self) -> dict[str, np.ndarray]:
        if not self._runs:
            empty = np.empty(0)
            return {
                n: empty.astype(np.int64 if n != "start" and n != "end" else float)
                for n in self.NAMES
            }
        end = np.fromiter(chain.from_iterable(self._ends), dtype=np.float64)
        start_of_run = np.array([r[0] for r in self._runs])
        k, kind, batch, tokens, kv_first, kv_step = (
            np.array([r[i] for r in self._runs], dtype=np.int64) for i in range(1, 7)
        )
        first = np.cumsum(k) - k
        start = np.concatenate(([0.0], end[:-1]))
        start[first] = start_of_run
        within = np.arange(end.shape[0]) - np.repeat(first, k)
        return {
            "start": start,
            "end": end,
            "kind": np.repeat(kind, k).astype(np.int8),
            "batch_size": np.repeat(batch, k),
            "num_tokens": np.repeat(tokens, k),
            "kv_used": np.repeat(kv_first, k) + np.repeat(kv_step, k) * within,
        }


@dataclass(eq=False)
class Timeline:
    """The result of one engine run over `trace` (rows align with the trace's rows)."""

    trace: Trace
    arrival: np.ndarray  # when each request arrived (NaN: never; chained calls differ from trace)
    status: np.ndarray  # int8 codes into STATUSES
    reason: np.ndarray  # object: str or None
    admitted_at: np.ndarray
    first_token_at: np.ndarray
    finished_at: np.ndarray
    generated: np.ndarray  # output tokens emitted
    first_decode: np.ndarray  # index of the request's first decode step among decode steps
    steps: dict[str, np.ndarray]
    pool_tokens: int
    info: dict[str, object] = field(default_factory=dict)
    counters: pd.DataFrame | None = None  # the policy's counter events (policies/counters.py)
    # vLLM-style engines: tokens come in runs of consecutive steps (a preemption ends one),
    # columns row, index (of the run's first token), step (row into `steps`), count
    token_runs: dict[str, np.ndarray] | None = None
    request_columns: dict[str, np.ndarray] = field(default_factory=dict)  # e.g. preemptions

    TOKEN_BLOCK = 1 << 20  # tokens per block when expanding the per-token timeline

    def token_times(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, index, time) of every emitted output token, grouped by row, index 0 first.

        Rows and indices are int32 to keep tens of millions of tokens compact; the arrays are
        filled a block of rows at a time so that no full-length temporaries are needed.
        """
        if self.token_runs is not None:
            return self._run_token_times()
        g = self.generated
        total = int(g.sum())
        rows = np.repeat(np.arange(g.shape[0], dtype=np.int32), g)
        index = np.empty(total, dtype=np.int32)
        time = np.empty(total)
        if total == 0:
            return rows, index, time
        decode_ends = self.steps["end"][self.steps["kind"] == DECODE]
        starts = np.cumsum(g) - g
        # token i >= 1 of a row is decode step first_decode + i - 1; token 0 is its prefill
        step_of_first = self.first_decode - 1
        bounds = np.searchsorted(starts, np.arange(0, total, self.TOKEN_BLOCK))
        for lo, hi in zip(bounds.tolist(), [*bounds[1:].tolist(), g.shape[0]], strict=True):
            if lo == hi:
                continue
            gs = g[lo:hi]
            a, b = int(starts[lo]), int(starts[hi - 1] + gs[-1])
            # int32 throughout: a block holds at most TOKEN_BLOCK tokens, and step numbers fit
            local = (starts[lo:hi] - a).astype(np.int32)
            within = index[a:b]
            np.subtract(np.arange(b - a, dtype=np.int32), np.repeat(local, gs), out=within)
            if decode_ends.size:
                step = within + np.repeat(step_of_first[lo:hi].astype(np.int32), gs)
                # token 0 (step -1 where first_decode is 0) is clipped here, set below
                decode_ends.take(step, out=time[a:b], mode="clip")
        has = g > 0
        time[starts[has]] = self.first_token_at[has]
        return rows, index, time

    def _run_token_times(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token times from runs: token index + j of a run is emitted at the end of step + j.
        Filled a block of runs at a time, like `token_times`, to keep temporaries small."""
        runs = self.token_runs
        assert runs is not None
        order = np.lexsort((runs["index"], runs["row"]))
        row, first, step, count = (runs[k][order] for k in ("row", "index", "step", "count"))
        total = int(count.sum())
        rows = np.repeat(row.astype(np.int32), count)
        index = np.empty(total, dtype=np.int32)
        time = np.empty(total)
        starts = np.cumsum(count) - count
        ends = self.steps["end"]
        block = self.TOKEN_BLOCK // 4  # four int64 temporaries per token below
        bounds = np.searchsorted(starts, np.arange(0, max(total, 1), block))
        for lo, hi in zip(bounds.tolist(), [*bounds[1:].tolist(), count.shape[0]], strict=True):
            if lo == hi:
                continue
            cs = count[lo:hi]
            a = int(starts[lo])
            b = a + int(cs.sum())
            within = np.arange(b - a, dtype=np.int64) - np.repeat(starts[lo:hi] - a, cs)
            index[a:b] = within + np.repeat(first[lo:hi], cs)
            within += np.repeat(step[lo:hi], cs)
            ends.take(within, out=time[a:b])
        return rows, index, time

    def requests_frame(self) -> pd.DataFrame:
        """One row per request; a trace's optional columns (interactions, think times) follow."""
        t = self.trace
        optional: dict[str, object] = {}
        if t.app is not None:  # users belong to apps (FairServe): the client is the user
            optional["app"] = pd.Categorical.from_codes(t.app, categories=list(t.app_names))
            optional["user"] = pd.Categorical.from_codes(t.client, categories=list(t.client_names))
        for name in (*OPTIONAL_INT_COLUMNS, "think_time"):
            if getattr(t, name) is not None:
                optional[name] = getattr(t, name)
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
        rows, index, time = self.token_times()
        return pd.DataFrame(
            {"request_id": self.trace.request_id[rows], "index": index, "time": time}
        )

    def steps_frame(self) -> pd.DataFrame:
        s = dict(self.steps)
        s["kind"] = pd.Categorical.from_codes(s["kind"], categories=list(STEP_KINDS))
        return pd.DataFrame(s)
