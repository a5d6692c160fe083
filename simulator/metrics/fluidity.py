"""Etalon's fluidity-index and the rates derived from it (docs/metrics.md §2).

A request's inter-token list is [t_1 - arrival, t_2 - t_1, ...]. Every token has a deadline
(D_p for the first, D_d for the rest); a token that beats its deadline banks the difference as
slack for later tokens, a late token is charged every deadline the stall covered and resets the
slack. fluidity = 1 - missed / total.

Two arithmetic conventions:
- float (default, `exact=False`): Etalon's own code, IEEE doubles and Python's float floor
  division, bit for bit. A gap that is an exact decimal multiple of D_d is often undercounted by
  one (0.3 // 0.05 == 5.0 in binary floating point).
- exact (`exact=True`): every gap and deadline is first rounded to an integer number of
  nanoseconds, then all arithmetic is integer, so decimal multiples count as written
  (0.3 s / 0.05 s is 6 deadlines).

All functions take many requests at once as a ragged array (values + lengths) and walk token
positions in lock step, so the Python loop runs once per token position, not once per token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.core.errors import ConfigError

NS_PER_S = 1_000_000_000
EXACT_DEADLINE_CAP_S = 1e5  # exact arithmetic: deadlines above this (and every gap) are capped
SEARCH_HIGH = 1e10  # Etalon's bisection range for the minimum deadline, seconds
SEARCH_GRANULARITY = 1e-4
FLUID_RATE_QUANTILE = 0.99
FLUID_RATE_TARGET_MISS = 0.1
TARGET_TBT_VALUES = np.arange(1, 101) / 1000.0  # 1..100 ms
# requests are scored in blocks of about this many gaps by the metrics whose temporaries are
# several times their input, so that memory stays flat in the run's length
BLOCK_VALUES = 1 << 20


@dataclass(frozen=True)
class Ragged:
    """Per-request float lists stored flat: request r owns `lengths[r]` values from
    `offsets[r]`."""

    values: np.ndarray
    lengths: np.ndarray

    @property
    def offsets(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths

    @classmethod
    def from_lists(cls, lists: Sequence[Sequence[float] | np.ndarray]) -> Ragged:
        lengths = np.array([len(x) for x in lists], dtype=np.int64)
        flat = [np.asarray(x, dtype=np.float64) for x in lists]
        values = np.concatenate(flat) if flat else np.empty(0)
        return cls(values.astype(np.float64), lengths)

    def take(self, rows: np.ndarray) -> Ragged:
        """The lists of `rows` (repeats allowed), in that order."""
        lengths = self.lengths[rows]
        return Ragged(self.values[ranges(self.offsets[rows], lengths)], lengths)

    def blocks(self, max_values: int | None = None) -> Iterator[tuple[slice, Ragged]]:
        """Consecutive rows, as (rows, their lists), holding at most `max_values` (default
        BLOCK_VALUES) values together (a row holding more is a block alone); the values are
        views, not copies."""
        max_values = BLOCK_VALUES if max_values is None else max_values
        ends = np.cumsum(self.lengths)
        lo, n = 0, self.lengths.shape[0]
        while lo < n:
            base = int(ends[lo] - self.lengths[lo])
            hi = max(lo + 1, int(np.searchsorted(ends, base + max_values, side="right")))
            yield slice(lo, hi), Ragged(self.values[base : int(ends[hi - 1])], self.lengths[lo:hi])
            lo = hi

    def drop_first(self) -> Ragged:
        """Each list without its first entry (Etalon's `should_ignore_first_token`)."""
        keep = np.ones(self.values.shape[0], dtype=bool)
        has = self.lengths > 0
        keep[self.offsets[has]] = False
        return Ragged(self.values[keep], np.maximum(self.lengths - 1, 0))


def deadline_counts(
    gaps: Ragged,
    ttft_deadline: np.ndarray | float,
    tbt_deadline: np.ndarray | float,
    exact: bool = False,
    first_is_prefill: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(missed, total) deadlines per request; deadlines may be scalars or one per request.

    With `first_is_prefill=False` every gap is judged against `tbt_deadline` (the lists are
    decode gaps only, as in Etalon's rate metrics).
    """
    n = gaps.lengths.shape[0]
    d_p: np.ndarray = np.broadcast_to(np.asarray(ttft_deadline, dtype=np.float64), (n,))
    d_d: np.ndarray = np.broadcast_to(np.asarray(tbt_deadline, dtype=np.float64), (n,))
    if n and (not np.all(d_d > 0) or not np.all(np.isfinite(d_d))):
        raise ConfigError(f"tbt_deadline must be a finite number > 0 seconds; got {d_d.min()}")
    if n and not np.all(d_p >= 0):
        raise ConfigError(f"ttft_deadline must be >= 0 seconds; got {d_p.min()}")
    values: np.ndarray = gaps.values
    if exact:
        # deadlines far above every gap act alike; capping them keeps nanoseconds in int64
        # (the minimum-deadline search probes up to 1e10 s)
        cap = max(EXACT_DEADLINE_CAP_S, 2.0 * float(values.max(initial=0.0)))
        d_p, d_d = np.minimum(d_p, cap), np.minimum(d_d, cap)
        values, d_p, d_d = (np.rint(x * NS_PER_S).astype(np.int64) for x in (values, d_p, d_d))
    order = np.argsort(-gaps.lengths, kind="stable")  # longest first: active rows are a prefix
    lengths = gaps.lengths[order]
    starts = gaps.offsets[order]
    d_p, d_d = d_p[order], d_d[order]
    zero = values.dtype.type(0)
    slack = np.zeros(n, dtype=values.dtype)
    missed = np.zeros(n, dtype=np.int64)
    total = np.zeros(n, dtype=np.int64)
    longest = int(lengths[0]) if n else 0
    active = np.searchsorted(-lengths, -np.arange(longest), side="left")  # rows with > j gaps
    for j in range(longest):
        c = int(active[j])
        t = values[starts[:c] + j]
        s = slack[:c]
        dd = d_d[:c]
        prefill = j == 0 and first_is_prefill
        deadline = d_p[:c] if prefill else dd
        hit = t <= deadline + s
        # a late token is charged every deadline its stall covered (Etalon's two formulas)
        late = 1 + np.floor_divide(t - s - deadline, dd) if prefill else np.floor_divide(t - s, dd)
        late = np.where(hit, 0, late).astype(np.int64)
        slack[:c] = np.where(hit, s + (deadline - t), zero)
        missed[:c] += late
        total[:c] += np.where(hit, 1, late)
    out_missed = np.empty(n, dtype=np.int64)
    out_total = np.empty(n, dtype=np.int64)
    out_missed[order] = missed
    out_total[order] = total
    return out_missed, out_total


def _rate(missed: np.ndarray, total: np.ndarray) -> np.ndarray:
    return np.divide(missed, total, out=np.zeros(missed.shape[0]), where=total > 0)


def fluidity_index(
    inter_token_times: list[float],
    ttft_deadline: float,
    tbt_deadline: float,
    exact: bool = False,
) -> tuple[float, int, int]:
    """(fluidity, missed, total) of one request; no tokens gives (1.0, 0, 0)."""
    missed, total = deadline_counts(
        Ragged.from_lists([inter_token_times]), ttft_deadline, tbt_deadline, exact
    )
    return 1.0 - float(_rate(missed, total)[0]), int(missed[0]), int(total[0])


def service_miss_rate(missed: np.ndarray, total: np.ndarray) -> float:
    """Service-level deadline miss rate: all missed deadlines over all deadlines (0 if none)."""
    t = int(total.sum())
    return int(missed.sum()) / t if t else 0.0


def min_tbt_deadline(
    gaps: Ragged,
    target_miss_rate: float = FLUID_RATE_TARGET_MISS,
    ttft_deadline: np.ndarray | float = 0.0,
    exact: bool = False,
    first_is_prefill: bool = True,
) -> np.ndarray:
    """Per request, the smallest D_d whose miss rate is <= target (Etalon's bisection over
    [0, 1e10] s with 1e-4 s granularity; 1e10 if no probe passed).

    A probe at or above a request's longest judged gap (with its prefill gap on time) misses
    nothing, so it passes without replaying the gaps; with decode gaps only, a probe below a
    request's shortest gap misses every deadline (rate 1), so it fails without replaying them:
    the same probes, far less work (below the shortest gap every gap is a candidate of
    `DecodeProbes`: the Azure run's fluid rate takes 0.55 s instead of 0.8-0.95 s)."""
    n = gaps.lengths.shape[0]
    d_p = np.broadcast_to(np.asarray(ttft_deadline, dtype=np.float64), (n,))
    always_on_time = _longest_judged_gap(gaps, d_p, first_is_prefill)
    probes = None if first_is_prefill else DecodeProbes(gaps, exact)
    left = np.zeros(n)
    right = np.full(n, SEARCH_HIGH)
    best = np.full(n, SEARCH_HIGH)
    while True:
        rows = np.flatnonzero(right - left > SEARCH_GRANULARITY)
        if rows.size == 0:
            return best
        mid = (left[rows] + right[rows]) / 2
        fails = np.zeros(rows.shape[0], dtype=bool)
        if probes is not None and target_miss_rate < 1:
            fails = probes.all_late(rows, mid)
        replay = np.flatnonzero((mid < always_on_time[rows]) & ~fails)
        if replay.size:
            if probes is None:
                sub = gaps.take(rows[replay])
                missed, total = deadline_counts(sub, d_p[rows[replay]], mid[replay], exact)
            else:
                missed, total = probes.counts(rows[replay], mid[replay])
            fails[replay] = _rate(missed, total) > target_miss_rate
        left[rows[fails]] = mid[fails] + SEARCH_GRANULARITY
        ok = rows[~fails]
        best[ok] = mid[~fails]
        right[ok] = mid[~fails] - SEARCH_GRANULARITY


def _longest_judged_gap(gaps: Ragged, d_p: np.ndarray, first_is_prefill: bool) -> np.ndarray:
    """Per request, the D_d at and above which no deadline is missed: its longest gap judged
    against D_d (+inf if its prefill gap misses D_p; -inf with no such gap)."""
    n = gaps.lengths.shape[0]
    judged = gaps.drop_first() if first_is_prefill else gaps
    longest = np.full(n, -np.inf)
    has = judged.lengths > 0
    if has.any():
        longest[has] = np.maximum.reduceat(judged.values, judged.offsets[has])
    if first_is_prefill:
        first = gaps.lengths > 0
        late = np.zeros(n, dtype=bool)
        late[first] = gaps.values[gaps.offsets[first]] > d_p[first]
        longest[late] = np.inf
    return longest


def fluid_token_rate(decode_gaps: Ragged, exact: bool = False) -> float:
    """Etalon's fluid token generation rate (tokens/s): 1 / P99 over requests of the minimum
    decode deadline at which the request misses at most 10% of its deadlines."""
    if decode_gaps.lengths.shape[0] == 0:
        return float("nan")
    return rate_of_deadlines(fluid_rate_deadlines(decode_gaps, exact))


def fluid_rate_deadlines(decode_gaps: Ragged, exact: bool = False) -> np.ndarray:
    """Per request, the minimum decode deadline `fluid_token_rate` takes the P99 of."""
    blocks = [
        min_tbt_deadline(block, FLUID_RATE_TARGET_MISS, 0.0, exact, first_is_prefill=False)
        for _, block in decode_gaps.blocks()
    ]
    return np.concatenate(blocks) if blocks else np.empty(0)


def rate_of_deadlines(deadlines: np.ndarray) -> float:
    """The fluid token rate of these per-request minimum deadlines (NaN: no request)."""
    if deadlines.shape[0] == 0:
        return float("nan")
    return float(1.0 / np.quantile(deadlines, FLUID_RATE_QUANTILE))


def miss_rate_at_tbt_targets(
    decode_gaps: Ragged,
    targets: np.ndarray = TARGET_TBT_VALUES,
    quantile: float = FLUID_RATE_QUANTILE,
    exact: bool = False,
) -> pd.DataFrame:
    """For each target D_d, the `quantile` over requests of the per-request miss rate
    (decode gaps only)."""
    targets = np.asarray(targets, dtype=np.float64)
    if decode_gaps.lengths.shape[0] == 0:
        return pd.DataFrame({"tbt_deadline": targets, "miss_rate": np.nan})
    rates = np.concatenate(
        [decode_miss_rates(block, targets, exact) for _, block in decode_gaps.blocks()], axis=1
    )
    return pd.DataFrame(
        {"tbt_deadline": targets, "miss_rate": np.quantile(rates, quantile, axis=1)}
    )


class MissRateCurve:
    """`miss_rate_at_tbt_targets` of `requests` requests whose decode gaps come a block at a
    time (`add`): per target it keeps only the largest rates, those the quantile can reach, so
    memory does not grow with the run."""

    def __init__(
        self,
        requests: int,
        targets: np.ndarray = TARGET_TBT_VALUES,
        quantile: float = FLUID_RATE_QUANTILE,
        exact: bool = False,
    ) -> None:
        self.targets = np.asarray(targets, dtype=np.float64)
        self.requests, self.quantile, self.exact = requests, quantile, exact
        # np.quantile interpolates between ranks floor((n - 1) q) and the one above
        lowest = int(np.floor((requests - 1) * np.float64(quantile))) if requests else 0
        self.keep = requests - lowest
        self.top = np.empty((self.targets.shape[0], 0))
        self.seen = 0

    def add(self, decode_gaps: Ragged) -> None:
        for _, block in decode_gaps.blocks():
            rates = decode_miss_rates(block, self.targets, self.exact)
            self.seen += rates.shape[1]
            both = np.concatenate((self.top, rates), axis=1)
            if both.shape[1] > self.keep:
                both = np.partition(both, both.shape[1] - self.keep, axis=1)[:, -self.keep :]
            self.top = both

    def frame(self) -> pd.DataFrame:
        if self.seen != self.requests:
            raise ValueError(f"MissRateCurve: {self.seen} of {self.requests} requests added")
        if self.requests == 0:
            return pd.DataFrame({"tbt_deadline": self.targets, "miss_rate": np.nan})
        # the rates below those kept only fill ranks the quantile does not read
        below = np.full(self.requests - self.keep, -np.inf)
        found = [np.quantile(np.concatenate((below, row)), self.quantile) for row in self.top]
        return pd.DataFrame({"tbt_deadline": self.targets, "miss_rate": found})


def decode_miss_rates(decode_gaps: Ragged, targets: np.ndarray, exact: bool = False) -> np.ndarray:
    """Per target D_d (rows) and request (columns), the miss rate of its decode gaps, exactly as
    `deadline_counts` (the token-by-token walk) gives it, without walking every token for every
    target.

    The walk's slack is a Lindley recursion: s_i = max(0, s_{i-1} + D - g_i). With Q_i = P_i -
    (i + 1) D (P the prefix sums of the gaps) it is s_i = M_i - Q_i, M_i the running maximum of
    Q (and 0), so a gap misses exactly when Q reaches a new maximum (a record), and then misses
    1 + floor((Q_i - M_{i-1}) / D) deadlines. Q only rises at gaps longer than D, so the
    records are found among those "candidates" alone: a small share of all (gap, target)
    pairs. A request whose every gap is longer than D misses all it is judged on (rate 1).

    The arithmetic is in integer nanoseconds, which is the exact convention itself. Under the
    float convention a decision (hit or miss, and the floor) can differ from Etalon's float walk
    only when it is within rounding of a tie; such (request, target) pairs are walked again
    token by token, so the result is the walk's in both conventions.
    """
    lengths = decode_gaps.lengths
    n, k = lengths.shape[0], targets.shape[0]
    rates = np.zeros((k, n))
    if n == 0 or decode_gaps.values.shape[0] == 0:
        return rates
    d_ns = np.rint(targets * NS_PER_S).astype(np.int64)
    ns = np.rint(decode_gaps.values * NS_PER_S).astype(np.int64)
    judged = ns if exact else decode_gaps.values  # what "longer than D_d" is decided on
    first, has = decode_gaps.offsets, lengths > 0
    shortest = np.full(n, np.inf)
    shortest[has] = np.minimum.reduceat(judged, first[has])
    order = np.argsort(shortest, kind="stable")  # requests join as D_d passes their shortest gap
    prefix = np.concatenate(([0], np.cumsum(ns)))  # P of a gap: prefix[pos + 1] - prefix[first]
    total = prefix[first + lengths] - prefix[first]
    # Q of request r lies in [-(n_r + 1) D_max, P_r]: offsets this far apart, increasing in the
    # order requests join, keep requests apart in one running maximum
    span = (total + (lengths + 1) * int(d_ns.max()) + 1)[order]
    if int(span.sum()) >= 1 << 62:
        raise OverflowError("decode gaps too long for the integer walk; please report")
    offset = np.empty(n, dtype=np.int64)
    offset[order] = np.cumsum(span) - span
    tolerance = int(lengths.max()) // 2 + 2  # ties the nanosecond rounding could move
    cand = Candidates.empty()  # gaps of the requests that can hit, each request's a block
    joined = 0
    redo_rows: list[np.ndarray] = []
    redo_targets: list[int] = []
    for t in np.argsort(targets, kind="stable").tolist():  # increasing: candidates only shrink
        d, d_judged = int(d_ns[t]), (d_ns[t] if exact else targets[t])
        cand = cand.longer_than(d_judged)
        can_hit = int(np.searchsorted(shortest[order], d_judged, side="right"))
        if can_hit > joined:  # requests whose shortest gap is now <= D_d
            rows = order[joined:can_hit]
            pos = ranges(first[rows], lengths[rows])
            req = np.repeat(rows, lengths[rows])
            longer = judged[pos] > d_judged
            pos, req = pos[longer], req[longer]
            place = pos - first[req] + 1
            p_at = prefix[pos + 1] - prefix[first[req]]
            cand = cand.join(Candidates(judged[pos], req, place, p_at, offset[req]))
            joined = can_hit
        records, missed, near = cand.records(n, d, None if exact else tolerance)
        row = rates[t]
        row[order[can_hit:]] = has[order[can_hit:]]  # every gap longer than D_d: rate 1
        mine = order[:can_hit]
        judged_n = lengths[mine] - records[mine] + missed[mine]
        row[mine] = np.divide(missed[mine], judged_n, out=np.zeros(can_hit), where=judged_n > 0)
        if near.size:
            redo_rows.append(near)
            redo_targets.extend([t] * near.shape[0])
    if redo_rows:  # the float walk decides the near-ties
        rows = np.concatenate(redo_rows)
        missed, judged_n = deadline_counts(
            decode_gaps.take(rows), 0.0, targets[redo_targets], exact, first_is_prefill=False
        )
        rates[redo_targets, rows] = _rate(missed, judged_n)
    return rates


class DecodeProbes:
    """Decode gaps prepared once to count deadline misses at many D_d (a bisection's probes)."""

    def __init__(self, gaps: Ragged, exact: bool) -> None:
        self.gaps, self.exact = gaps, exact
        ns = np.rint(gaps.values * NS_PER_S).astype(np.int64)
        self.judged = ns if exact else gaps.values  # what "longer than D_d" is decided on
        self.prefix = np.concatenate(([0], np.cumsum(ns)))
        self.first, self.lengths = gaps.offsets, gaps.lengths
        self.n = self.lengths.shape[0]
        # each gap's request: one pass compares every gap with its request's D_d (int32: half
        # the memory of the run's biggest arrays)
        self.request = np.repeat(np.arange(self.n, dtype=np.int32), self.lengths)
        self.time = self.prefix[self.first + self.lengths] - self.prefix[self.first]
        self.cap = max(EXACT_DEADLINE_CAP_S, 2.0 * float(gaps.values.max(initial=0.0)))
        self.longest_ns = float(ns.max(initial=0)) + 1
        self.tolerance = None if exact else int(self.lengths.max(initial=0)) // 2 + 2
        has = self.lengths > 0
        self.shortest = np.full(self.n, -np.inf)  # per request, what all_late compares with
        if has.any():
            self.shortest[has] = np.minimum.reduceat(self.judged, self.first[has])

    def all_late(self, rows: np.ndarray, tbt_deadline: np.ndarray) -> np.ndarray:
        """Whether each of `rows` has only gaps longer than its D_d: then every deadline is
        missed (rate 1), as `counts` would find (False for a request without gaps)."""
        if self.exact:
            d_ns = np.rint(np.minimum(tbt_deadline, self.cap) * NS_PER_S)
            return d_ns < self.shortest[rows]
        return tbt_deadline < self.shortest[rows]

    def counts(
        self, rows: np.ndarray, tbt_deadline: np.ndarray | float
    ) -> tuple[np.ndarray, np.ndarray]:
        """(missed, total) of each of `rows` (distinct request indices) at its D_d."""
        n = rows.shape[0]
        d = np.array(np.broadcast_to(np.asarray(tbt_deadline, dtype=np.float64), (n,)))
        if n and (not np.all(d > 0) or not np.all(np.isfinite(d))):
            raise ConfigError(f"tbt_deadline must be a finite number > 0 seconds; got {d.min()}")
        lengths = self.lengths[rows]
        if n == 0 or int(lengths.sum()) == 0:
            return np.zeros(n, dtype=np.int64), lengths.astype(np.int64)
        if np.unique(rows).shape[0] != n:
            raise ConfigError("rows must be distinct request indices")
        if self.exact:  # as deadline_counts: deadlines far above every gap act alike
            d = np.minimum(d, self.cap)
        # only a gap longer than D_d can miss: above the longest gap D_d's value no longer
        # matters, which keeps nanoseconds in int64
        d_ns = np.minimum(np.rint(d * NS_PER_S), self.longest_ns).astype(np.int64)
        # per request (all of them, so that one pass over the gaps finds the candidates): its
        # D_d, +inf for a request not probed (none of its gaps is longer)
        over = np.full(self.n, np.inf)
        over[rows] = d_ns if self.exact else d
        pos = np.flatnonzero(self.judged > over[self.request])
        req = self.request[pos].astype(np.int64)
        d_of = np.zeros(self.n, dtype=np.int64)
        d_of[rows] = d_ns
        # offsets in request order keep each request's Q apart in one running maximum
        span = np.zeros(self.n, dtype=np.int64)
        span[rows] = self.time[rows] + (lengths + 1) * d_ns + 1
        if int(span.sum()) >= 1 << 62:
            raise OverflowError("decode gaps too long for the integer walk; please report")
        offset = np.cumsum(span) - span
        start = self.first[req]
        cand = Candidates(
            self.judged[pos],
            req,
            pos - start + 1,
            self.prefix[pos + 1] - self.prefix[start],
            offset[req],
        )
        records, missed, near = cand.records(self.n, d_of[req], self.tolerance)
        missed, total = missed[rows], lengths - records[rows] + missed[rows]
        if near.size:  # the float walk decides the near-ties
            local = np.full(self.n, -1)
            local[rows] = np.arange(n)
            near = local[near]
            missed[near], total[near] = deadline_counts(
                self.gaps.take(rows[near]), 0.0, d[near], self.exact, first_is_prefill=False
            )
        return missed, total


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions start .. start + length - 1 of every range, one range after another."""
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(lengths) - lengths, lengths
    )
    return np.repeat(starts, lengths) + within


@dataclass(frozen=True)
class Candidates:
    """Gaps that may miss at the current D_d, as columns: the value judged against D_d, the
    request, the gap's place (1-based) within it, P there (ns) and the request's offset."""

    judged: np.ndarray
    request: np.ndarray
    place: np.ndarray
    prefix: np.ndarray
    offset: np.ndarray

    @classmethod
    def empty(cls) -> Candidates:
        i = np.empty(0, dtype=np.int64)
        return cls(np.empty(0), i, i, i, i)

    def _columns(self) -> tuple[np.ndarray, ...]:
        return (self.judged, self.request, self.place, self.prefix, self.offset)

    def longer_than(self, d: float) -> Candidates:
        keep = self.judged > d
        return Candidates(*(col[keep] for col in self._columns()))

    def join(self, other: Candidates) -> Candidates:
        pairs = zip(self._columns(), other._columns(), strict=True)
        return Candidates(*(np.concatenate(pair) for pair in pairs))

    def records(
        self, n: int, d: int | np.ndarray, tolerance: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request: records and deadlines missed at D_d = d ns (one value, or one per
        candidate), and (given a tolerance: the float convention) the requests with a decision
        within `tolerance` ns of a tie."""
        records = np.zeros(n, dtype=np.int64)
        missed = np.zeros(n, dtype=np.int64)
        if self.request.shape[0] == 0:
            return records, missed, np.empty(0, dtype=np.int64)
        key = self.prefix - self.place * d + self.offset  # Q, moved to the request's offset
        running = np.maximum.accumulate(key)
        before = np.empty_like(running)
        before[0] = self.offset[0]
        before[1:] = running[:-1]
        # the running maximum before each candidate, at least the request's start level 0 (an
        # earlier request's values all lie below this one's offset, so they never count)
        excess = key - np.maximum(before, self.offset)
        record = excess > 0
        at = self.request[record]
        d_at = d if isinstance(d, int) else d[record]
        late = excess[record] // d_at  # each record misses 1 + this many
        if at.shape[0]:
            starts = np.flatnonzero(np.concatenate(([True], at[1:] != at[:-1])))
            who = at[starts]
            records[who] = np.diff(np.append(starts, at.shape[0]))
            missed[who] = np.add.reduceat(late, starts) + records[who]
        if tolerance is None:
            return records, missed, np.empty(0, dtype=np.int64)
        rem = excess[record] - late * d_at
        floor_tie = (rem <= tolerance) | (rem >= d_at - tolerance)
        tie = np.abs(excess) <= tolerance
        return records, missed, np.unique(np.concatenate((self.request[tie], at[floor_tie])))
