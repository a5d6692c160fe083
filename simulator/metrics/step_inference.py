"""Engine steps inferred from client-side token times alone (the input of `fairsim-calibrate`).

A continuous-batching engine emits one token for every request in its batch at the end of each
step, so the tokens of different requests arrive in bursts: sorted by time, a gap wider than
`gap` seconds separates two steps. Per step: its time (the burst's first token: the writes of
one step queue behind each other, the first is the least delayed), the requests that got their
first token (a prefill: how many, and their prompt tokens) and those that got a later one (a
decode: how many, and the KV context they read, prompt + the token's index, as the engines
count it). A step's duration is the time since the step before, and is usable only when the
engine had work all along (some request sent and unfinished at the previous step), and both
bursts were unambiguous (no request twice in one burst).

Limits: chunked prefill spreads one prompt over several steps of which the client sees only the
last; network jitter above `gap` splits a burst; a replica set interleaves its replicas' steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.metrics.latency import tbt_values

STEP_FIELDS = (
    "time", "duration", "tokens", "prefills", "prompt_tokens", "decodes", "context", "usable",
)  # fmt: skip


def default_gap(tokens: pd.DataFrame) -> float:
    """A third of the 5th percentile of one request's inter-token gaps: a request gets at most
    one token per step, so its gaps are at least a step long, and a step's burst is far shorter."""
    gaps = tbt_values(tokens)
    gaps = gaps[gaps > 0]
    if gaps.size == 0:
        raise ValueError("no request received two tokens: steps cannot be inferred")
    return float(np.percentile(gaps, 5)) / 3


def infer_steps(requests: pd.DataFrame, tokens: pd.DataFrame, gap: float) -> pd.DataFrame:
    """One row per inferred step (STEP_FIELDS), in time order."""
    facts = requests.set_index("request_id")
    t = tokens.sort_values("time", kind="stable")
    time = t["time"].to_numpy()
    if time.size == 0:
        return pd.DataFrame({f: [] for f in STEP_FIELDS})
    ids = t["request_id"].to_numpy()
    index = t["index"].to_numpy()
    prompt = facts["prompt_len"].reindex(ids).to_numpy(dtype=np.int64)
    step = np.concatenate(([0], np.cumsum(np.diff(time) > gap)))
    n = int(step[-1]) + 1
    first = index == 0
    count = np.bincount(step, minlength=n)
    prefills = np.bincount(step, weights=first, minlength=n).astype(np.int64)
    prompt_tokens = np.bincount(step, weights=prompt * first, minlength=n).astype(np.int64)
    context = np.bincount(step, weights=(prompt + index) * ~first, minlength=n).astype(np.int64)
    start_of = np.searchsorted(step, np.arange(n))
    at = time[start_of]
    # a burst holding one request twice merged two steps
    again = pd.DataFrame({"step": step, "id": ids}).duplicated().to_numpy()
    ambiguous = np.zeros(n, dtype=bool)
    ambiguous[step[again]] = True
    busy = _busy_at(requests, tokens, at, gap)
    usable = np.zeros(n, dtype=bool)
    usable[1:] = busy[:-1] & ~ambiguous[1:] & ~ambiguous[:-1]
    duration = np.full(n, np.nan)
    duration[1:] = np.diff(at)
    return pd.DataFrame(
        {
            "time": at,
            "duration": duration,
            "tokens": count,
            "prefills": prefills,
            "prompt_tokens": prompt_tokens,
            "decodes": count - prefills,
            "context": context,
            "usable": usable,
        }
    )


def _busy_at(
    requests: pd.DataFrame, tokens: pd.DataFrame, at: np.ndarray, gap: float
) -> np.ndarray:
    """Whether some request had been sent by each time and had tokens still to come after it:
    then the engine had work, and its next step started right away."""
    last = tokens.groupby("request_id")["time"].max()
    sent = requests.set_index("request_id")["arrival"].reindex(last.index).to_numpy()
    sent_before = np.searchsorted(np.sort(sent), at - gap, side="left")
    done_by = np.searchsorted(np.sort(last.to_numpy()), at + gap, side="right")
    return sent_before - done_by > 0
