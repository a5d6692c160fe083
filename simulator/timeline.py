"""What a run produced: per-request facts, per-step records and the per-token timeline.

Per-token times are stored compactly and expanded on demand: a request's first token is produced
by its prefill step and every later token by one decode step, and a running request takes part in
every decode step until it finishes. So its tokens are `first_token_at` followed by the end times
of `generated - 1` consecutive decode steps starting at decode step `first_decode`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from traces.schema import Trace

STATUSES = ("completed", "rejected", "refused", "in_flight")
COMPLETED, REJECTED, REFUSED, IN_FLIGHT = range(4)
STEP_KINDS = ("prefill", "decode")
PREFILL, DECODE = range(2)


class StepLog:
    """Growable numpy columns for per-step records (appended one step or one run at a time)."""

    NAMES = ("start", "end", "kind", "batch_size", "num_tokens", "kv_used")
    DTYPES = (np.float64, np.float64, np.int8, np.int64, np.int64, np.int64)

    def __init__(self, capacity: int = 1024) -> None:
        self.size = 0
        self._cols = [np.empty(capacity, dtype=d) for d in self.DTYPES]

    def append(self, start, end, kind, batch_size, num_tokens, kv_used) -> None:  # type: ignore[no-untyped-def]
        """Append k steps; every argument is a scalar or an array of length k."""
        k = np.shape(end)[0] if np.ndim(end) else 1
        if self.size + k > self._cols[0].shape[0]:
            cap = max(2 * self._cols[0].shape[0], self.size + k)
            self._cols = [np.resize(c, cap) for c in self._cols]
        sl = slice(self.size, self.size + k)
        for col, value in zip(self._cols, (start, end, kind, batch_size, num_tokens, kv_used)):
            col[sl] = value
        self.size += k

    def columns(self) -> dict[str, np.ndarray]:
        return {n: c[: self.size].copy() for n, c in zip(self.NAMES, self._cols)}


@dataclass(eq=False)
class Timeline:
    """The result of one engine run over `trace` (rows align with the trace's rows)."""

    trace: Trace
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

    def token_times(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, index, time) of every emitted output token, grouped by row, index 0 first."""
        g = self.generated
        rows = np.repeat(np.arange(g.shape[0]), g)
        if rows.size == 0:
            return rows, rows.copy(), np.empty(0)
        starts = np.cumsum(g) - g
        index = np.arange(rows.shape[0]) - np.repeat(starts, g)
        decode_ends = self.steps["end"][self.steps["kind"] == DECODE]
        time = np.empty(rows.shape[0])
        first = index == 0
        time[first] = self.first_token_at[rows[first]]
        later = ~first
        time[later] = decode_ends[self.first_decode[rows[later]] + index[later] - 1]
        return rows, index, time

    def requests_frame(self) -> pd.DataFrame:
        t = self.trace
        return pd.DataFrame(
            {
                "request_id": t.request_id,
                "client": pd.Categorical.from_codes(t.client, categories=list(t.client_names)),
                "arrival": t.arrival,
                "prompt_len": t.prompt_len,
                "output_len": t.output_len,
                "status": pd.Categorical.from_codes(self.status, categories=list(STATUSES)),
                "reason": pd.array(self.reason, dtype="string"),
                "admitted_at": self.admitted_at,
                "first_token_at": self.first_token_at,
                "finished_at": self.finished_at,
                "tokens_emitted": self.generated,
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
