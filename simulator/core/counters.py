"""A record of every change to a policy's per-client counters, so they can be plotted afterwards.

Each event is (time, client, delta, cause, value): `value` is the counter right after the change.
Causes: admit (prompt, plus the predicted output for VTC with prediction), decode, finish_extra
(the artifact's quirk), refund (prediction above the actual length), lift (VTC's counter lift),
refill (DRR's quantum), complete (FairServe's charge at completion, the artifact's form),
prompt (a chunk of prompt computed by a chunked-prefill engine, charged as it is scheduled).
"""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

CAUSES = ("admit", "decode", "finish_extra", "refund", "lift", "refill", "complete", "prompt")
ADMIT, DECODE, FINISH_EXTRA, REFUND, LIFT, REFILL, COMPLETE, PROMPT = range(len(CAUSES))


class CounterLog:
    """The events in flat typed buffers: a run of many small updates (one decode step at a time)
    costs 24 bytes an event, where keeping each call's arrays cost about 400 bytes a call (a
    100,000-request overload run held 1 GB of them; bench/cli_end_to_end.py --workload
    overload). Consecutive calls for the same client and cause share one (client, cause,
    count) entry."""

    def __init__(self) -> None:
        self._time = array("d")
        self._delta = array("d")
        self._value = array("d")
        # per add/add_many call: its client, cause and length (expanded in `frame`)
        self._client = array("q")
        self._cause = array("b")
        self._count = array("q")

    def add(self, time: float, client: int, delta: float, value: float, cause: int) -> None:
        self._time.append(time)
        self._delta.append(delta)
        self._value.append(value)
        if self._count and self._client[-1] == client and self._cause[-1] == cause:
            self._count[-1] += 1  # the same client and cause as the call before: one entry
            return
        self._client.append(client)
        self._cause.append(cause)
        self._count.append(1)

    def add_many(
        self, times: np.ndarray, client: int, deltas: np.ndarray, values: np.ndarray, cause: int
    ) -> None:
        for buffer, column in ((self._time, times), (self._delta, deltas), (self._value, values)):
            buffer.frombytes(np.ascontiguousarray(column, dtype=np.float64).tobytes())
        if self._count and self._client[-1] == client and self._cause[-1] == cause:
            self._count[-1] += times.shape[0]
            return
        self._client.append(client)
        self._cause.append(cause)
        self._count.append(times.shape[0])

    def frame(self, client_names: list[str]) -> pd.DataFrame:
        """Events by time (ties in the order they happened): time, client, cause, delta, value."""
        counts = np.frombuffer(self._count, dtype=np.int64)
        cols: dict[str, np.ndarray] = {
            "time": np.frombuffer(self._time, dtype=np.float64),
            "client": np.repeat(np.frombuffer(self._client, dtype=np.int64), counts),
            "cause": np.repeat(np.frombuffer(self._cause, dtype=np.int8), counts),
            "delta": np.frombuffer(self._delta, dtype=np.float64),
            "value": np.frombuffer(self._value, dtype=np.float64),
        }
        order = np.argsort(cols["time"], kind="stable")  # runs log client by client
        return pd.DataFrame(
            {
                "time": cols["time"][order],
                "client": pd.Categorical.from_codes(cols["client"][order], categories=client_names),
                "cause": pd.Categorical.from_codes(cols["cause"][order], categories=list(CAUSES)),
                "delta": cols["delta"][order],
                "value": cols["value"][order],
            }
        )
