"""The VTC paper's workloads, generated request for request as its artifact did.

The artifact seeds numpy's legacy global `RandomState` once per suite (seed 42) and draws in a
fixed order; each generator below draws from its own `RandomState(seed)` in that same order, so
seed 42 replays the measured runs exactly while no global state is touched. Request ids are the
artifact's (creation order); requests at equal times keep that order, as its stable sort did.

Modes:
- "uniform": per client in turn: prompt lengths, output lengths (`randint(lo, hi)`), a start
  phase `rand() / rate`; then N = int(rate * duration) evenly spaced arrivals after the phase.
- "poisson", "poisson_short_long", "poisson_short_long_2": one client draw per request
  (`rand() > r0 / (r0 + r1)` is client 1), lengths, then Gamma(1/cv², cv²/Σrate) gaps (cv = -1,
  i.e. Poisson). short_long quarters client 0's lengths; short_long_2 swaps them.
- "increase": client 0 evenly spaced from t = 0 (no phase); client 1's rate rises linearly from
  0.2 to rates[1], each gap taken at the rate of the previous arrival.
- "dist_shift": three phases of duration / 3 with rates [0.5, 2] (client 0 ON/OFF), [1, 1], [0.5,
  1.5], each generated like "uniform" from the phase start.
ON/OFF (`on_off` = period > 0): client 0's requests with floor(t / period) odd are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from traces.files import resolve_path
from traces.loaders import load_vtc_real
from traces.schema import Trace, TraceError

MODES = (
    "uniform",
    "poisson",
    "poisson_short_long",
    "poisson_short_long_2",
    "increase",
    "dist_shift",
)
DIST_SHIFT_PHASES = ((0.5, 2.0, 60.0), (1.0, 1.0, -1.0), (0.5, 1.5, -1.0))  # rate0, rate1, on_off
REAL_TRACE = "data:vtc/real_trace.csv"  # shipped with fairsim


@dataclass
class _Requests:
    """Requests in the artifact's creation order."""

    client: list[int]
    arrival: list[float]
    prompt: list[int]
    output: list[int]

    def add(self, client: int, t: float, p: int, o: int) -> None:
        self.client.append(client)
        self.arrival.append(t)
        self.prompt.append(p)
        self.output.append(o)


def _skipped(t: float, on_off: float) -> bool:
    return on_off > 0 and int(t // on_off) & 1 == 1


@dataclass(frozen=True)
class ArtifactSuite:
    """One synthetic suite of the VTC artifact; `build(seed)` with seed 42 gives its exact trace."""

    mode: str
    rates: Sequence[float]
    duration: float
    input_range: Sequence[int] = (256, 257)
    output_range: Sequence[int] = (256, 257)
    on_off: float = -1.0
    cv: float = -1.0
    weights: Sequence[float] | None = None
    name: str = "vtc_suite"
    # tokens the server's tokenizer adds to each drawn prompt length: the artifact sends
    # "Hello " * n as text and its server re-encodes it, LLaMA's tokenizer giving BOS + n +
    # a trailing "▁", n + 2 tokens, which its router admits and charges
    server_added_tokens: int = 2

    def __post_init__(self) -> None:
        where = f"workload '{self.name}'"
        if self.mode not in MODES:
            raise TraceError(f"{where}: mode must be one of {MODES}, got {self.mode!r}")
        if not self.rates or any(not (np.isfinite(r) and r > 0) for r in self.rates):
            raise TraceError(f"{where}: rates must be numbers > 0, got {list(self.rates)}")
        if self.mode != "uniform" and len(self.rates) != 2:
            raise TraceError(f"{where}: mode {self.mode!r} takes exactly 2 rates")
        if not (np.isfinite(self.duration) and self.duration > 0):
            raise TraceError(f"{where}: duration must be > 0, got {self.duration}")
        for label, (lo, hi) in (
            ("input_range", self.input_range),
            ("output_range", self.output_range),
        ):
            if not (1 <= lo < hi):
                raise TraceError(f"{where}: {label} must be [lo, hi) with 1 <= lo < hi")
        if self.weights is not None and len(self.weights) != len(self.rates):
            raise TraceError(f"{where}: weights needs one value per client ({len(self.rates)})")
        if self.server_added_tokens < 0:
            raise TraceError(f"{where}: server_added_tokens must be >= 0")
        if self.cv == 0:
            raise TraceError(f"{where}: cv must be nonzero (-1 or 1 means Poisson)")

    def build(self, seed: int) -> Trace:
        rs = np.random.RandomState(seed)
        reqs = _Requests([], [], [], [])
        if self.mode == "uniform":
            self._uniform(rs, reqs, list(self.rates), 0.0, self.duration, self.on_off)
        elif self.mode == "dist_shift":
            third = self.duration / 3
            for i, (r0, r1, on_off) in enumerate(DIST_SHIFT_PHASES):
                self._uniform(rs, reqs, [r0, r1], i * third, third, on_off)
        elif self.mode == "increase":
            self._increase(rs, reqs)
        else:
            self._poisson(rs, reqs)
        names = [f"client{i}" for i in range(len(self.rates))]
        weights = self.weights or [1.0] * len(names)
        return Trace.from_columns(
            client=np.asarray(names, dtype=object)[np.asarray(reqs.client, dtype=np.int64)],
            client_names=names,
            client_weights=dict(zip(names, (float(w) for w in weights))),
            arrival=reqs.arrival,
            prompt_len=np.asarray(reqs.prompt, dtype=np.int64) + self.server_added_tokens,
            output_len=reqs.output,
            request_id=np.arange(len(reqs.arrival)),
            source=f"workload '{self.name}'",
            sort=True,
        )

    def _lengths(self, rs: np.random.RandomState, n: int) -> tuple[np.ndarray, np.ndarray]:
        prompt = rs.randint(self.input_range[0], self.input_range[1], n)
        output = rs.randint(self.output_range[0], self.output_range[1], n)
        return prompt, output

    def _uniform(
        self,
        rs: np.random.RandomState,
        reqs: _Requests,
        rates: list[float],
        start: float,
        duration: float,
        on_off: float,
    ) -> None:
        for c, rate in enumerate(rates):
            n = int(rate * duration)
            prompt, output = self._lengths(rs, n)
            t = start + rs.rand() * 1 / rate
            for j in range(n):
                t += 1 / rate
                if c == 0 and _skipped(t, on_off):
                    continue
                reqs.add(c, t, int(prompt[j]), int(output[j]))

    def _increase(self, rs: np.random.RandomState, reqs: _Requests) -> None:
        rate0, end_rate = self.rates
        n = int(rate0 * self.duration)
        prompt, output = self._lengths(rs, n)
        t = 0.0
        for j in range(n):
            t += 1 / rate0
            if _skipped(t, self.on_off):
                continue
            reqs.add(0, t, int(prompt[j]), int(output[j]))
        start_rate = 0.2
        n = int(0.5 * (start_rate + end_rate) * self.duration)
        prompt, output = self._lengths(rs, n)
        t = 0.0
        for j in range(n):
            t += 1 / (start_rate + (end_rate - start_rate) * t / self.duration)
            reqs.add(1, t, int(prompt[j]), int(output[j]))

    def _poisson(self, rs: np.random.RandomState, reqs: _Requests) -> None:
        r0, r1 = self.rates
        n = int((r0 + r1) * self.duration)
        client = (rs.rand(n) > r0 / (r0 + r1)).astype(int)
        prompt, output = self._lengths(rs, n)
        cv2 = self.cv * self.cv
        gaps = rs.gamma(1 / cv2, cv2 / (r0 + r1), n)
        t = 0.0
        for i in range(n):
            t += gaps[i]
            p, o = int(prompt[i]), int(output[i])
            if client[i] == 0:
                if _skipped(t, self.on_off):
                    continue
                if self.mode == "poisson_short_long":
                    p, o = p // 4, o // 4
                elif self.mode == "poisson_short_long_2":
                    p, o = o, p
            reqs.add(int(client[i]), t, p, o)


@dataclass(frozen=True)
class VTCRealTrace:
    """The stored trace the VTC artifact ran for its real-workload results (27 clients, 600 s).

    The default is the copy shipped with fairsim (`data:vtc/real_trace.csv`); `path` may name
    another file (columns req_id, arrival_s, client, prompt_len, output_len).
    """

    path: str = REAL_TRACE
    name: str = "vtc_real"
    # tokens the server adds to each recorded prompt length: the artifact sends these prompts
    # as "Hello " * n too (fair_bench/trace.py), which its server encodes as n + 2 tokens
    server_added_tokens: int = 2

    def __post_init__(self) -> None:
        if self.server_added_tokens < 0:
            raise TraceError(f"workload '{self.name}': server_added_tokens must be >= 0")

    def resolve(self) -> Path:
        return resolve_path(self.path, f"workload '{self.name}' trace")

    def build(self, seed: int) -> Trace:
        trace = load_vtc_real(self.resolve())
        return replace(trace, prompt_len=trace.prompt_len + self.server_added_tokens)
