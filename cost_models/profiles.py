"""Reading the VTC artifact's A10G / Llama-7B profile and fitting `LinearStepCost` to it.

`cost_profile.json` maps input_len -> output_len -> [batch size that fills the pool, prefill
seconds per request, decode seconds per request], each measured with a full pool of identical
requests. From it:

- prefill rows: one request of `input_len` tokens takes `prefill seconds per request`;
- decode rows: a batch of B requests decodes `output_len` steps in B * (decode s/request) seconds,
  so one step takes B * decode / output_len at a mean context of B * (input_len + output_len / 2).
  Rows with output_len = 1 have no decode steps and are skipped.

The fit is ordinary least squares: prefill time per request = a + b * input_len (a becomes the
per-request term), decode step time = c + d * B + e * context. The numbers it gives are written in
`conf/cost_model/a10g_llama7b.yaml`; a test re-runs the fit when the profile is present.

`fit_router_timings` fits the decode terms and the per-step overhead to a server's measured
per-request timings instead (what a kernel profile cannot see); on the artifact's two FCFS runs it
gives the shape of `conf/cost_model/a10g_llama7b_artifact.yaml`, whose speed `centred_on_runs`
then sets to the typical speed of the artifact's 22 logged runs; tests re-run both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from cost_models.linear import LinearStepCost
from cost_models.table import ProfileError


def vtc_profile_table(path: str | Path) -> pd.DataFrame:
    """The profile as rows of (phase, batch_size, tokens, seconds): `TableStepCost`'s format."""
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    rows: list[tuple[str, int, float, float]] = []
    for inp, by_out in raw.items():
        for out, (batch, prefill_s, decode_s) in by_out.items():
            i, o, b = int(inp), int(out), int(batch)
            rows.append(("prefill", 1, float(i), float(prefill_s)))
            if o > 1:
                rows.append(("decode", b, b * (i + o / 2), b * float(decode_s) / o))
    return pd.DataFrame(rows, columns=["phase", "batch_size", "tokens", "seconds"])


def fit_vtc_profile(path: str | Path) -> LinearStepCost:
    table = vtc_profile_table(path)
    pre = table[table.phase == "prefill"]
    a, b = np.linalg.lstsq(
        np.column_stack([np.ones(len(pre)), pre.tokens]), pre.seconds, rcond=None
    )[0]
    dec = table[table.phase == "decode"]
    c, d, e = np.linalg.lstsq(
        np.column_stack([np.ones(len(dec)), dec.batch_size, dec.tokens]), dec.seconds, rcond=None
    )[0]
    return LinearStepCost(
        decode_base=float(c),
        decode_per_seq=float(d),
        decode_per_context_token=float(e),
        prefill_per_token=float(b),
        prefill_per_request=float(a),
    )


@dataclass(frozen=True)
class RouterTimings:
    """One measured run of a serving router, per completed request: when it was sent, when its
    first token and its last token came back (seconds), and the prompt tokens the server
    counted and the output tokens it generated."""

    sent: np.ndarray
    first_token: np.ndarray
    finished: np.ndarray
    prompt: np.ndarray
    output: np.ndarray


SAMPLES_PER_REQUEST = 40  # instants at which a request's decode interval is read
SAME_PREFILL = 0.01  # seconds: first tokens this close together came from one prefill step


def fit_router_timings(runs: list[RouterTimings], kernel: LinearStepCost) -> LinearStepCost:
    """The decode terms and `step_overhead` that explain measured end-to-end timings, the prefill
    terms kept from `kernel` (a kernel profile times prefill well; what it misses is the loop's
    own cost per step and the decode step's shape as a real server runs it).

    Between its first and last token a request of o output tokens sits through o - 1 decode
    steps, each of the whole running batch, and through the prefill steps of the requests that
    joined meanwhile (a continuous-batching router such as S-LoRA's prefills a new batch in a
    step of its own). Its decode interval therefore costs

        (o - 1) (decode_base + step_overhead) + decode_per_seq (o - 1) n + decode_per_context_token
        (o - 1) C + step_overhead B + prefill kernel time of what joined,

    with n and C the batch size and the context (prompt plus tokens generated, each request's
    tokens taken to grow evenly between its first and last token) averaged over the interval,
    and B the prefill steps in it. A non-negative least-squares fit over every request of every
    run gives the four coefficients; B separates the per-step overhead from the decode base."""
    rows: list[list[float]] = []
    targets: list[float] = []
    for run in runs:
        f, e = np.asarray(run.first_token, float), np.asarray(run.finished, float)
        p, o = np.asarray(run.prompt, float), np.asarray(run.output, float)
        span = np.maximum(e - f, 1e-12)
        for i in np.flatnonzero((o >= 3) & (e > f)):
            t = f[i] + (np.arange(SAMPLES_PER_REQUEST) + 0.5) * (e[i] - f[i]) / SAMPLES_PER_REQUEST
            live = (f[None, :] <= t[:, None]) & (t[:, None] < e[None, :])
            grown = np.clip((t[:, None] - f[None, :]) / span[None, :], 0.0, 1.0)
            n = live.sum(axis=1).mean()
            context = ((p[None, :] + o[None, :] * grown) * live).sum(axis=1).mean()
            joined = (f > f[i]) & (f < e[i])
            firsts = np.sort(f[joined])
            steps = 0 if not firsts.size else 1 + int((np.diff(firsts) > SAME_PREFILL).sum())
            k = o[i] - 1
            rows.append([k, k + steps, k * n, k * context])
            prefill = kernel.prefill_per_token * p[joined].sum()
            targets.append(e[i] - f[i] - prefill - kernel.prefill_per_request * joined.sum())
    if not rows:
        raise ProfileError("fit_router_timings: no completed request with 3 or more output tokens")
    base, overhead, per_seq, per_context = nnls(np.array(rows), np.array(targets))[0]
    return LinearStepCost(
        decode_base=float(base),
        decode_per_seq=float(per_seq),
        decode_per_context_token=float(per_context),
        prefill_per_token=kernel.prefill_per_token,
        prefill_per_request=kernel.prefill_per_request,
        step_overhead=float(overhead),
    )


def centred_on_runs(cost: LinearStepCost, speeds: Sequence[float]) -> LinearStepCost:
    """`cost` at the typical speed of a server whose runs went at `speeds` (each run's measured
    time per output token over what `cost` gives for it): every term of a step's time times
    their geometric mean, the front end (outside the loop) kept. A model fitted on a few runs
    takes those runs' speed; replications that draw a run speed around 1
    (`engine.run_speed_cv`, its CV the spread of the same log speeds) should draw it around
    the runs' centre instead."""
    if not speeds or min(speeds) <= 0:
        raise ProfileError(f"centred_on_runs: speeds must be positive numbers, got {speeds!r}")
    factor = float(np.exp(np.mean(np.log(np.asarray(speeds, dtype=float)))))
    in_loop = {name: value * factor for name, value in vars(cost).items()}
    return replace(cost, **{**in_loop, "frontend_latency": cost.frontend_latency})
