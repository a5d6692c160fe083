"""Per-request state of one run, shared by the runner and every replica.

Rows are the trace's rows. The runner writes arrivals and endings; a step model writes what it
decides (admission, first token, its replica) and the tokens it emitted. Python lists hold the
scalars the engine loops read and write most (numpy indexing one element at a time is slow).
"""

from __future__ import annotations

import numpy as np

from traces.schema import Trace

# failed: a measured request (fairsim-bench) that ended in an error: an HTTP error, a timeout,
# a dropped connection; a simulation never fails a request
STATUSES = ("completed", "rejected", "refused", "in_flight", "failed")
CLIENT_TIMEOUT = "client_timeout"  # the reason of a request whose client gave up (rejected)
COMPLETED, REJECTED, REFUSED, IN_FLIGHT, FAILED = range(len(STATUSES))


class RequestState:
    def __init__(self, trace: Trace) -> None:
        n = len(trace)
        self.prompt: list[int] = trace.prompt_len.tolist()
        self.output: list[int] = trace.output_len.tolist()
        self.client = trace.client
        self.client_of: list[int] = trace.client.tolist()
        # arrival times as they happen; NaN until then (a chained call waits for its predecessor)
        self.arrival = np.where(trace.predecessor() < 0, trace.arrival, np.nan)
        self.status = np.full(n, IN_FLIGHT, dtype=np.int8)
        self.reason = np.full(n, "not_arrived", dtype=object)
        self.admitted_at = np.full(n, np.nan)
        self.first_token_at = np.full(n, np.nan)
        self.finished_at = np.full(n, np.nan)
        self.replica = np.full(n, -1, dtype=np.int64)  # the replica running (or that ran) it
        # output tokens emitted; a step model may count them itself while a request runs and
        # write them here when it stops (`StepModel.close`)
        self.generated: list[int] = [0] * n
        self.ended = 0  # requests completed, rejected or refused

    def end(self, req: int, status: int, reason: str) -> None:
        """Rejected or refused: never served (or, dropped after a preemption, never finished)."""
        self.status[req] = status
        self.reason[req] = reason
        self.ended += 1

    def complete(self, rows: list[int], now: float) -> None:
        """These requests produced their last token at `now`."""
        for req in rows:
            self.finished_at[req] = now
            self.status[req] = COMPLETED
            self.reason[req] = None
            self.generated[req] = self.output[req]
        self.ended += len(rows)
