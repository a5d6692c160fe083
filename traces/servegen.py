"""ServeGen client pools (Alibaba's per-client statistical workloads) turned into request streams.

A pool is a folder, or a .tar.gz read in place (nothing is extracted or unpickled), holding per
client `chunk-<id>-trace.csv` (no header: window_start_s, rate, cv, dist, shape, scale; one row
per 10-minute window; dist is Gamma or Weibull for the inter-arrival times, empty when the rate is
0) and, for most clients, `chunk-<id>-dataset.json` ({window_start_s: {"input_tokens": PMF,
"output_tokens": PMF}} per 6-hour window, each PMF a Python dict literal, read with
`ast.literal_eval`). Clients without length PMFs draw from the pool-wide PMF of that window (all
clients' PMFs averaged); the trace's source says how many did.

`ServeGenPool.build` generates, per client and window, a renewal process with the window's
inter-arrival law, every gap divided by one factor so that the pool's mean total rate over the
chosen period equals `target_rate`; lengths come from the PMFs of the 6-hour window holding the
arrival. Seeding: one SeedSequence child per client (arrivals, prompts, outputs).
"""

from __future__ import annotations

import ast
import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from traces.files import resolve_path
from traces.schema import Trace, TraceError

CHUNK = re.compile(r"chunk-(\d+)-(trace\.csv|dataset\.json)$")
TRACE_COLUMNS = ["window_start", "rate", "cv", "dist", "shape", "scale"]
DISTRIBUTIONS = ("Gamma", "Weibull")
WINDOW_S = 600.0  # arrival statistics window
LENGTH_WINDOW_S = 21600.0  # length PMF window


@dataclass(frozen=True)
class PMF:
    values: np.ndarray
    probs: np.ndarray

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(self.values, size=n, p=self.probs)


@dataclass(frozen=True)
class ClientStats:
    """One client: its 10-minute arrival windows and its 6-hour length windows (PMFs parsed on
    first use: a pool holds millions of PMF entries and a run needs a few windows)."""

    client_id: int
    windows: pd.DataFrame  # TRACE_COLUMNS, sorted by window_start
    source: str = ""
    raw_lengths: dict[float, dict[str, object]] = field(default_factory=dict)
    _parsed: dict[float, tuple[PMF, PMF] | None] = field(default_factory=dict, repr=False)

    def lengths(self, window: float) -> tuple[PMF, PMF] | None:
        """(input, output) PMFs of a 6-hour window; None if the client has none there."""
        if window not in self._parsed:
            entry = self.raw_lengths.get(window, {})
            pin, pout = (
                _pmf(entry.get(k, "{}"), self.source, f"window {window:g}, field {k!r}")
                for k in ("input_tokens", "output_tokens")
            )
            self._parsed[window] = (pin, pout) if pin is not None and pout is not None else None
        return self._parsed[window]


def _files(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if CHUNK.search(p.name)}
    try:
        with tarfile.open(path, "r:*") as tar:
            out = {}
            for m in tar.getmembers():
                name = Path(m.name).name
                if m.isfile() and CHUNK.search(name):
                    f = tar.extractfile(m)
                    if f is not None:
                        out[name] = f.read()
            return out
    except (tarfile.TarError, OSError) as err:
        raise TraceError(
            f"{path}: not a readable archive ({err}); accepted: a folder or .tar.gz of ServeGen "
            "chunk-<id>-trace.csv / chunk-<id>-dataset.json files"
        ) from None


def _pmf(text: object, source: str, where: str) -> PMF | None:
    """A PMF from a dict literal; None when empty. Never `eval`."""
    try:
        table = ast.literal_eval(text) if isinstance(text, str) else text
    except (ValueError, SyntaxError) as err:
        raise TraceError(
            f"{source}: {where}: not a dict literal ({err}); accepted: {{length: probability}}"
        ) from None
    if not isinstance(table, dict):
        raise TraceError(f"{source}: {where}: got {type(table).__name__}; accepted: a dict")
    if not table:
        return None
    values = np.array(list(table.keys()), dtype=float)
    probs = np.array(list(table.values()), dtype=float)
    if not (np.isfinite(probs).all() and (probs >= 0).all() and probs.sum() > 0):
        raise TraceError(f"{source}: {where}: probabilities must be >= 0 with a positive sum")
    if (values < 0).any() or (values != np.round(values)).any():
        raise TraceError(f"{source}: {where}: lengths must be integers >= 0")
    return PMF(np.maximum(values, 1).astype(np.int64), probs / probs.sum())


def _windows(raw: bytes, source: str) -> pd.DataFrame:
    try:
        frame = pd.read_csv(io.StringIO(raw.decode("utf-8")), header=None, names=TRACE_COLUMNS)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        msg = f"{source}: unreadable ({err}); accepted: CSV rows {TRACE_COLUMNS}"
        raise TraceError(msg) from None
    for col in ("window_start", "rate", "cv", "shape", "scale"):
        v = pd.to_numeric(frame[col], errors="coerce")
        bad = v.isna() | (v < 0)
        if bad.any():
            row = int(np.argmax(bad.to_numpy()))
            raise TraceError(
                f"{source}: row {row}, field {col!r}: got {frame[col].iloc[row]!r}; accepted: a "
                "number >= 0"
            )
        frame[col] = v.astype(float)
    dist = frame["dist"].fillna("").astype(str)
    bad = (frame["rate"] > 0).to_numpy() & ~dist.isin(DISTRIBUTIONS).to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        raise TraceError(
            f"{source}: row {row}, field 'dist': got {dist.iloc[row]!r}; accepted: one of "
            f"{DISTRIBUTIONS} where the rate is > 0"
        )
    frame["dist"] = dist
    return frame.sort_values("window_start", kind="stable").reset_index(drop=True)


def load_servegen_pool(path: str | Path) -> list[ClientStats]:
    """Every client of a pool, in client-id order."""
    p = resolve_path(path, "ServeGen pool")
    files = _files(p)
    traces = {int(m.group(1)): n for n in files if (m := CHUNK.search(n)) and "trace" in n}
    if not traces:
        raise TraceError(f"{p}: no chunk-<id>-trace.csv files; accepted: a ServeGen client pool")
    clients = []
    for cid in sorted(traces):
        name = f"chunk-{cid}-dataset.json"
        source = f"{p}:{name}"
        raw: dict[float, dict[str, object]] = {}
        if name in files:
            try:
                doc = json.loads(files[name].decode("utf-8"))
                raw = {float(w): dict(entry) for w, entry in doc.items()}
            except (UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError) as err:
                raise TraceError(
                    f"{source}: not a ServeGen dataset ({err}); accepted: a JSON object "
                    '{window_start_s: {"input_tokens": "{...}", "output_tokens": "{...}"}}'
                ) from None
        windows = _windows(files[traces[cid]], f"{p}:{traces[cid]}")
        clients.append(ClientStats(cid, windows, source, raw))
    return clients


def _gaps(row: pd.Series, k: int, rng: np.random.Generator) -> np.ndarray:
    if row["dist"] == "Gamma":
        return rng.gamma(row["shape"], row["scale"], k)
    return row["scale"] * rng.weibull(row["shape"], k)


def _pool_pmf(clients: list[ClientStats], window: float, which: int) -> PMF:
    """All clients' PMFs for a window, averaged (the fallback for clients without PMFs)."""
    pmfs = [both[which] for c in clients if (both := c.lengths(window)) is not None]
    if not pmfs:
        raise TraceError(f"no client of the pool has length PMFs for window {window:g}")
    values = np.unique(np.concatenate([p.values for p in pmfs]))
    probs = np.zeros(values.size)
    for p in pmfs:
        np.add.at(probs, np.searchsorted(values, p.values), p.probs / len(pmfs))
    return PMF(values, probs / probs.sum())


@dataclass(frozen=True)
class ServeGenPool:
    """Per-client request streams from a ServeGen pool over [start, start + duration) seconds of
    its timeline, scaled to a total mean rate of `target_rate` requests/s; `clients` limits the
    pool to some client ids (None: all). Client names are `client<id>`."""

    path: str
    target_rate: float
    duration: float = 3600.0
    start: float = 0.0
    clients: tuple[int, ...] | None = None
    name: str = "servegen"

    def configured_rate(self) -> float:
        return self.target_rate

    def build(self, seed: int) -> Trace:
        if not (self.target_rate > 0 and self.duration > 0 and self.start >= 0):
            raise TraceError(
                f"workload '{self.name}': needs target_rate > 0, duration > 0, start >= 0"
            )
        pool = load_servegen_pool(self.path)
        if self.clients is not None:
            known = {c.client_id for c in pool}
            missing = sorted(set(self.clients) - known)
            if missing:
                raise TraceError(f"workload '{self.name}': clients {missing} not in the pool")
            pool = [c for c in pool if c.client_id in set(self.clients)]
        end = self.start + self.duration
        total = sum(self._mean_rate(c, end) for c in pool)
        if total <= 0:
            raise TraceError(f"workload '{self.name}': the pool sends nothing in the period")
        factor = self.target_rate / total  # gaps are divided by it
        names, times, prompt, output = [], [], [], []
        fallback = 0
        for c, ss in zip(pool, np.random.SeedSequence(seed).spawn(len(pool)), strict=True):
            a_rng, p_rng, o_rng = (np.random.default_rng(s) for s in ss.spawn(3))
            t = self._arrivals(c, end, factor, a_rng)
            p_c = np.empty(t.size, dtype=np.int64)
            o_c = np.empty(t.size, dtype=np.int64)
            for window, idx in self._by_length_window(t):
                own = c.lengths(window)
                fallback += own is None
                pin, pout = own or (_pool_pmf(pool, window, 0), _pool_pmf(pool, window, 1))
                p_c[idx] = pin.sample(idx.size, p_rng)
                o_c[idx] = pout.sample(idx.size, o_rng)
            names.append(np.full(t.size, f"client{c.client_id}", dtype=object))
            times.append(t)
            prompt.append(p_c)
            output.append(o_c)
        a_all = np.concatenate(times) - self.start
        if a_all.size == 0:
            raise TraceError(f"workload '{self.name}': no requests generated")
        order = np.argsort(a_all, kind="stable")
        return Trace.from_columns(
            client=np.concatenate(names)[order],
            client_names=[f"client{c.client_id}" for c in pool],
            arrival=a_all[order],
            prompt_len=np.concatenate(prompt)[order],
            output_len=np.concatenate(output)[order],
            source=f"{self.path} (ServeGen, {len(pool)} clients, {fallback} client-windows with "
            f"pool-wide length PMFs, seed {seed})",
        )

    def _mean_rate(self, c: ClientStats, end: float) -> float:
        w = c.windows
        overlap = (
            np.minimum(w["window_start"] + WINDOW_S, end)
            - np.maximum(w["window_start"], self.start)
        ).clip(lower=0)
        return float((w["rate"] * overlap).sum() / self.duration)

    def _arrivals(
        self, c: ClientStats, end: float, factor: float, rng: np.random.Generator
    ) -> np.ndarray:
        out = []
        w = c.windows
        live = w[(w["window_start"] + WINDOW_S > self.start) & (w["window_start"] < end)]
        for _, row in live[live["rate"] > 0].iterrows():
            lo = row["window_start"]
            hi = lo + WINDOW_S
            expected = int(row["rate"] * factor * WINDOW_S * 1.2) + 16
            t = lo + np.cumsum(_gaps(row, expected, rng)) / factor
            while t[-1] < hi:  # rare: draw more gaps
                t = np.concatenate([t, t[-1] + np.cumsum(_gaps(row, expected, rng)) / factor])
            out.append(t[(t < hi) & (t >= self.start) & (t < end)])
        return np.concatenate(out) if out else np.empty(0)

    @staticmethod
    def _by_length_window(t: np.ndarray) -> list[tuple[float, np.ndarray]]:
        """Arrivals grouped by the 6-hour PMF window holding them."""
        slot = np.floor(t / LENGTH_WINDOW_S)
        return [(float(s * LENGTH_WINDOW_S), np.flatnonzero(slot == s)) for s in np.unique(slot)]
