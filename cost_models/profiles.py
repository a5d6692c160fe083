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
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from cost_models.linear import LinearStepCost


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
