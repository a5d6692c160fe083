"""A record of every change to a policy's per-client counters, so they can be plotted afterwards.

Each event is (time, client, delta, cause, value): `value` is the counter right after the change.
Causes: admit (prompt, plus the predicted output for VTC with prediction), decode, finish_extra
(the artifact's quirk), refund (prediction above the actual length), lift (VTC's counter lift),
refill (DRR's quantum), complete (FairServe's charge at completion, the artifact's form),
prompt (a chunk of prompt computed by a chunked-prefill engine, charged as it is scheduled).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

# A spill file is a temporary, read back once to write the run folder's own (compressed) files:
# written without dictionaries or compression, 4M step records of five columns go to disk about
# 3x faster (0.43-0.45 -> 0.13-0.14 s) and read back as fast or faster, in a file 1.8x larger
# (64 -> 112 MB, deleted at the end): python benchmarks/write_formats.py on the 2-core VM
SPILL_FORMAT = {"compression": "none", "use_dictionary": False}

CAUSES = ("admit", "decode", "finish_extra", "refund", "lift", "refill", "complete", "prompt")
ADMIT, DECODE, FINISH_EXTRA, REFUND, LIFT, REFILL, COMPLETE, PROMPT = range(len(CAUSES))


class CounterLog:
    """The events in flat typed buffers: a run of many small updates (one decode step at a time)
    costs 24 bytes an event, where keeping each call's arrays cost about 400 bytes a call (a
    100,000-request overload run held 1 GB of them; benchmarks/cli_end_to_end.py --workload
    overload). Consecutive calls for the same client and cause share one (client, cause,
    count) entry.

    After `spill_to`, every `limit` events are written to a Parquet file in the order they
    were logged and let go of; `write_sorted` then writes them by time."""

    def __init__(self) -> None:
        self._clear()
        self._kept = True  # False: events are let go of as they come (`discard`)
        self._spill: Path | None = None
        self._limit = 0
        self._writer: pq.ParquetWriter | None = None
        self._part_min: list[float] = []  # the earliest time of each part written

    def _clear(self) -> None:
        self._time = array("d")
        self._delta = array("d")
        self._value = array("d")
        # per add/add_many call: its client, cause and length (expanded in `frame`)
        self._client = array("q")
        self._cause = array("b")
        self._count = array("q")

    def spill_to(self, path: Path, limit: int) -> None:
        """From now on, write the events to `path` whenever `limit` of them are buffered."""
        if limit < 1:
            raise ValueError(f"spill limit must be >= 1 event, got {limit}")
        self._spill, self._limit = path, limit

    def discard(self) -> None:
        """From now on, keep no events: for counters whose log nobody reads (a gateway's
        flow control logged one event per token it passed, 24 bytes each, in memory)."""
        self._kept = False
        self._clear()

    def add(self, time: float, client: int, delta: float, value: float, cause: int) -> None:
        if not self._kept:
            return
        self._time.append(time)
        self._delta.append(delta)
        self._value.append(value)
        if self._count and self._client[-1] == client and self._cause[-1] == cause:
            self._count[-1] += 1  # the same client and cause as the call before: one entry
        else:
            self._client.append(client)
            self._cause.append(cause)
            self._count.append(1)
        if self._spill is not None and len(self._time) >= self._limit:
            self._write()

    def add_many(
        self, times: np.ndarray, client: int, deltas: np.ndarray, values: np.ndarray, cause: int
    ) -> None:
        if not self._kept:
            return
        for buffer, column in ((self._time, times), (self._delta, deltas), (self._value, values)):
            buffer.frombytes(np.ascontiguousarray(column, dtype=np.float64).tobytes())
        if self._count and self._client[-1] == client and self._cause[-1] == cause:
            self._count[-1] += times.shape[0]
        else:
            self._client.append(client)
            self._cause.append(cause)
            self._count.append(times.shape[0])
        if self._spill is not None and len(self._time) >= self._limit:
            self._write()

    def _columns(self) -> dict[str, np.ndarray]:
        """The buffered events in the order they were logged (client and cause as codes)."""
        counts = np.frombuffer(self._count, dtype=np.int64)
        return {
            "time": np.frombuffer(self._time, dtype=np.float64),
            "client": np.repeat(np.frombuffer(self._client, dtype=np.int64), counts),
            "cause": np.repeat(np.frombuffer(self._cause, dtype=np.int8), counts),
            "delta": np.frombuffer(self._delta, dtype=np.float64),
            "value": np.frombuffer(self._value, dtype=np.float64),
        }

    def _write(self) -> None:
        assert self._spill is not None
        table = pa.table(self._columns())
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._spill, table.schema, **SPILL_FORMAT)
        if table.num_rows:  # one row group a part: write_sorted reads them back as parts
            self._writer.write_table(table, row_group_size=table.num_rows)
            self._part_min.append(float(np.min(table.column("time").to_numpy())))
        self._clear()

    def frame(self, client_names: list[str]) -> pd.DataFrame:
        """Events by time (ties in the order they happened): time, client, cause, delta, value."""
        if self._writer is not None:
            raise RuntimeError("the events were written to their spill file; see write_sorted")
        return _by_time(self._columns(), client_names)

    def write_sorted(self, client_names: list[str], write: Callable[[pd.DataFrame], None]) -> None:
        """After `spill_to`: every event, as `frame` orders them, handed to `write` a part at a
        time. Each written part is sorted; events of a later part may still precede some of
        an earlier one (a cluster's replica logs a burst of steps client by client), so each
        part is merged with what is left over and only events before every later part's
        earliest time go out."""
        assert self._spill is not None
        self._write()
        assert self._writer is not None
        self._writer.close()
        later_min = np.minimum.accumulate(np.array([*self._part_min, np.inf])[::-1])[::-1]
        file = pq.ParquetFile(self._spill)
        if file.num_row_groups == 0:  # no event: an empty table still has its columns
            write(_frame(self._columns(), client_names))
        left: dict[str, np.ndarray] | None = None
        for i in range(file.num_row_groups):
            table = file.read_row_group(i)
            part = {name: table.column(name).to_numpy() for name in table.column_names}
            if left is not None:
                part = {k: np.concatenate((left[k], part[k])) for k in part}
            order = np.argsort(part["time"], kind="stable")
            part = {k: v[order] for k, v in part.items()}
            cut = int(np.searchsorted(part["time"], later_min[i + 1], side="left"))
            write(_frame({k: v[:cut] for k, v in part.items()}, client_names))
            left = {k: v[cut:] for k, v in part.items()}
        self._spill.unlink()


def _by_time(cols: dict[str, np.ndarray], client_names: list[str]) -> pd.DataFrame:
    order = np.argsort(cols["time"], kind="stable")  # runs log client by client
    return _frame({k: v[order] for k, v in cols.items()}, client_names)


def _frame(cols: dict[str, np.ndarray], client_names: list[str]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "time": cols["time"],
            "client": pd.Categorical.from_codes(cols["client"], categories=client_names),
            "cause": pd.Categorical.from_codes(cols["cause"], categories=list(CAUSES)),
            "delta": cols["delta"],
            "value": cols["value"],
        }
    )
