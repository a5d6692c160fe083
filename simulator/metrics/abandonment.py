"""Clients that gave up (`client_timeout`): how many requests their clients abandoned, at which
point, and the output the engine generated for them in vain. A pure function of the requests
table of a run whose trace carries client timeouts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.core.requests import CLIENT_TIMEOUT


def client_timeouts(requests: pd.DataFrame) -> dict[str, int]:
    """Requests whose clients gave up: in all, before their first token (waiting) or after it
    (running or preempted), and the output tokens emitted to clients no longer there."""
    gone = (requests["reason"] == CLIENT_TIMEOUT).fillna(False).to_numpy(dtype=bool)
    emitted = requests["tokens_emitted"].to_numpy()[gone]
    return {
        "requests": int(gone.sum()),
        "before_first_token": int(np.count_nonzero(emitted == 0)),
        "after_first_token": int(np.count_nonzero(emitted > 0)),
        "output_tokens_wasted": int(emitted.sum()),
    }
