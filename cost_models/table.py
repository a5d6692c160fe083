"""A table-driven step-time model: a CSV profile, interpolated.

CSV columns (one row per measurement): `phase` (`prefill` or `decode`), `batch_size`, `tokens`,
`seconds`. For prefill rows `tokens` is the sum of prompt tokens in the step; for decode rows it is
the KV context the batch attends to. Prefill interpolates linearly in tokens (extrapolating the
end segments). Decode interpolates linearly over (batch_size, tokens) inside the measured region
and uses a least-squares plane fitted to all decode rows outside it, so that a batch bigger than
any profiled one still costs more rather than being clamped.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cost_models.base import CostModelError
from traces.files import file_source, read_table
from traces.schema import TraceError, position

if TYPE_CHECKING:  # scipy is imported when a table is loaded, not with every cost model
    from scipy.interpolate import LinearNDInterpolator

REQUIRED = ("phase", "batch_size", "tokens", "seconds")


class ProfileError(CostModelError):
    """A profile CSV that cannot be used; names the file, row and field."""


def _interp_extrapolate(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    if xp.shape[0] == 1:
        return np.full(x.shape, fp[0])
    y = np.interp(x, xp, fp)
    lo, hi = x < xp[0], x > xp[-1]
    y[lo] = fp[0] + (x[lo] - xp[0]) * (fp[1] - fp[0]) / (xp[1] - xp[0])
    y[hi] = fp[-1] + (x[hi] - xp[-1]) * (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
    return y


class TableStepCost:
    """Step times interpolated from a measured profile (see module docstring for the format)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        table = read_profile(path)
        pre = table[table.phase == "prefill"].groupby("tokens", sort=True)["seconds"].mean()
        self._prefill_x = pre.index.to_numpy(dtype=np.float64)
        self._prefill_y = pre.to_numpy(dtype=np.float64)
        dec = table[table.phase == "decode"].groupby(["batch_size", "tokens"])["seconds"].mean()
        pts = np.asarray(dec.index.tolist(), dtype=np.float64)
        vals = dec.to_numpy(dtype=np.float64)
        design = np.column_stack([np.ones(len(vals)), pts])
        self._plane = np.linalg.lstsq(design, vals, rcond=None)[0]
        # a triangulation needs 3 points not on one line; otherwise the plane is all we have
        self._inside: LinearNDInterpolator | None = None
        if len(vals) >= 3 and np.linalg.matrix_rank(design) == 3:
            from scipy.interpolate import LinearNDInterpolator

            self._inside = LinearNDInterpolator(pts, vals)

    def prefill_time(self, prompt_lens: np.ndarray) -> float:
        total = float(np.asarray(prompt_lens).sum())
        return float(_interp_extrapolate(np.array([total]), self._prefill_x, self._prefill_y)[0])

    def decode_times(self, batch_size: int, context_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(context_tokens, dtype=np.float64)
        plane = self._plane[0] + self._plane[1] * batch_size + self._plane[2] * ctx
        if self._inside is None:
            return plane
        inside = self._inside(np.full(ctx.shape, float(batch_size)), ctx)
        return np.where(np.isnan(inside), plane, inside)

    def decode_time(self, batch_size: int, context_tokens: int) -> float:
        return float(self.decode_times(batch_size, np.array([context_tokens]))[0])


def read_profile(path: str | Path) -> pd.DataFrame:
    try:
        table = read_table(path, "csv")
    except TraceError as err:  # missing, empty, not UTF-8, malformed: say it is the profile
        raise ProfileError(f"cost_model.path: {err}") from None
    source = file_source(path, table)
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise ProfileError(f"{path}: missing column(s) {missing}; accepted columns: {REQUIRED}")
    for col in ("batch_size", "tokens", "seconds"):
        values = pd.to_numeric(table[col], errors="coerce")
        bad = values.isna() | (values < 0) | ~np.isfinite(values.fillna(0))
        if col != "tokens":
            bad |= values <= 0
        if bad.any():
            row = int(np.argmax(bad.to_numpy()))
            raise ProfileError(
                f"{path}: {position(source, row)}, field '{col}': got {table[col].iloc[row]!r}; "
                "accepted: a finite number > 0 (tokens may be 0)"
            )
        table[col] = values
    bad_phase = ~table.phase.isin(["prefill", "decode"])
    if bad_phase.any():
        row = int(np.argmax(bad_phase.to_numpy()))
        raise ProfileError(
            f"{path}: {position(source, row)}, field 'phase': got {table.phase.iloc[row]!r}; "
            "accepted: 'prefill' or 'decode'"
        )
    for phase in ("prefill", "decode"):
        if not (table.phase == phase).any():
            raise ProfileError(f"{path}: no '{phase}' rows; the profile needs both phases")
    return table
