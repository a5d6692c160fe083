"""A record of every change to a policy's per-client counters, so they can be plotted afterwards.

Each event is (time, client, delta, cause, value): `value` is the counter right after the change.
Causes: admit (prompt, plus the predicted output for VTC with prediction), decode, finish_extra
(the artifact's quirk), refund (prediction above the actual length), lift (VTC's counter lift),
refill (DRR's quantum), complete (FairServe's charge at completion, the artifact's form),
prompt (a chunk of prompt computed by a chunked-prefill engine, charged as it is scheduled).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

CAUSES = ("admit", "decode", "finish_extra", "refund", "lift", "refill", "complete", "prompt")
ADMIT, DECODE, FINISH_EXTRA, REFUND, LIFT, REFILL, COMPLETE, PROMPT = range(len(CAUSES))


class CounterLog:
    def __init__(self) -> None:
        self._time: list[np.ndarray] = []
        self._delta: list[np.ndarray] = []
        self._value: list[np.ndarray] = []
        # per add_many call: its client, cause and length (expanded in `frame`)
        self._client: list[int] = []
        self._cause: list[int] = []
        self._count: list[int] = []

    def add(self, time: float, client: int, delta: float, value: float, cause: int) -> None:
        self.add_many(np.array([time]), client, np.array([delta]), np.array([value]), cause)

    def add_many(
        self, times: np.ndarray, client: int, deltas: np.ndarray, values: np.ndarray, cause: int
    ) -> None:
        self._time.append(times)
        self._delta.append(deltas)
        self._value.append(values)
        self._client.append(client)
        self._cause.append(cause)
        self._count.append(times.shape[0])

    def frame(self, client_names: list[str]) -> pd.DataFrame:
        """Events by time (ties in the order they happened): time, client, cause, delta, value."""
        if not self._time:
            cols: dict[str, np.ndarray] = {
                k: np.empty(0) for k in ("time", "client", "cause", "delta", "value")
            }
            cols["client"] = cols["client"].astype(np.int64)
            cols["cause"] = cols["cause"].astype(np.int8)
        else:
            counts = np.asarray(self._count, dtype=np.int64)
            cols = {
                "time": np.concatenate(self._time),
                "client": np.repeat(np.asarray(self._client, dtype=np.int64), counts),
                "cause": np.repeat(np.asarray(self._cause, dtype=np.int8), counts),
                "delta": np.concatenate(self._delta),
                "value": np.concatenate(self._value),
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
