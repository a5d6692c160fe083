"""Etalon's fluidity-index (docs/metrics.md §2): reference vectors in both conventions, the
paper's early-vs-late stall, and the lock-step implementation against a per-token oracle."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.metrics import fluidity as fl
from simulator.metrics import fluidity_index

# (itt, D_p, D_d) -> (float miss rate, missed, total), (exact missed, total)
REFERENCE = [
    ([], 0.1, 0.05, (0.0, 0, 0), (0, 0)),
    ([0.05], 0.1, 0.05, (0.0, 0, 1), (0, 1)),
    ([0.25], 0.1, 0.05, (1.0, 3, 3), (4, 4)),
    ([0.26], 0.1, 0.05, (1.0, 4, 4), (4, 4)),
    ([0.05, 0.06, 0.07, 0.02], 0.1, 0.05, (0.0, 0, 4), (0, 4)),
    ([0.1, 0.05, 0.3, 0.05], 0.1, 0.05, (0.625, 5, 8), (6, 9)),
    ([0.0, 0.3], 0.0, 0.1, (0.6667, 2, 3), (3, 4)),
    ([0.5] + [0.04] * 19 + [0.16], 0.5, 0.1, (0.0, 0, 21), (0, 21)),
    ([0.5, 0.16] + [0.04] * 19, 0.5, 0.1, (0.0476, 1, 21), (1, 21)),
]


@pytest.mark.parametrize(("itt", "d_p", "d_d", "flt", "exact"), REFERENCE)
def test_reference_vectors_in_both_conventions(itt, d_p, d_d, flt, exact):
    index, missed, total = fluidity_index(itt, d_p, d_d)
    assert (missed, total) == flt[1:]
    assert 1.0 - index == pytest.approx(flt[0], abs=5e-5)
    index, missed, total = fluidity_index(itt, d_p, d_d, exact=True)
    assert (missed, total) == exact
    assert index == (1.0 - missed / total if total else 1.0)


def test_early_stall_is_penalised_and_late_stall_absorbed():
    """The paper's figure: 20 gaps of 40 ms and one 160 ms stall, D_d = 100 ms. Both orders have
    the same P90 TBT and TPOT, but only the early stall costs fluidity (0.95 vs 1.00)."""
    early = [0.5, 0.16] + [0.04] * 19
    late = [0.5] + [0.04] * 19 + [0.16]
    assert np.percentile(early[1:], 90) == np.percentile(late[1:], 90)
    assert np.mean(early[1:]) == pytest.approx(np.mean(late[1:]))
    # one missed deadline among 21 judged tokens: 1 - 1/21 (the paper rounds it to 0.95)
    assert fluidity_index(early, 0.5, 0.1)[0] == pytest.approx(1 - 1 / 21, abs=1e-12)
    assert fluidity_index(late, 0.5, 0.1)[0] == 1.0


def test_empty_and_one_token_requests():
    assert fluidity_index([], 0.1, 0.05) == (1.0, 0, 0)
    assert fluidity_index([0.1], 0.1, 0.05) == (1.0, 0, 1)  # on time, inclusive
    assert fluidity_index([0.4], 0.1, 0.05)[0] == 0.0  # one late token: fluidity 0


def test_minimum_deadline_reference_vector():
    gaps = fl.Ragged.from_lists([[0.1, 0.05, 0.05, 0.2]])
    best = fl.min_tbt_deadline(gaps, 0.1, ttft_deadline=0.1)
    # Etalon's own bisection (a transcription of its function, run once): where its 1e-4 s
    # granularity stops above the true threshold 0.1
    assert best[0] == pytest.approx(0.10022863428932816, rel=1e-12)


def test_fluid_token_rate_of_steady_streams_is_the_token_rate():
    """Every request streams at exactly 20 ms per token: the minimum deadline is 20 ms (within
    the search granularity), so the fluid rate is 50 tokens/s."""
    gaps = fl.Ragged.from_lists([[0.02] * 50 for _ in range(10)])
    rate = fl.fluid_token_rate(gaps)
    assert rate == pytest.approx(50.0, rel=0.01)


def test_miss_rate_at_target_tbt_values_falls_as_the_deadline_grows():
    rng = np.random.default_rng(0)
    gaps = fl.Ragged.from_lists([rng.exponential(0.03, 40) for _ in range(50)])
    table = fl.miss_rate_at_tbt_targets(gaps)
    assert list(table.tbt_deadline) == pytest.approx(np.arange(1, 101) / 1000)
    assert np.all(np.diff(table.miss_rate) <= 1e-12)
    one = [fl.deadline_counts(gaps, 0.0, 0.05, first_is_prefill=False)]
    rates = one[0][0] / np.maximum(one[0][1], 1)
    assert table.miss_rate[49] == pytest.approx(np.quantile(rates, 0.99))


def test_bad_deadlines_are_rejected():
    with pytest.raises(ValueError, match="tbt_deadline"):
        fluidity_index([0.1], 0.1, 0.0)
    with pytest.raises(ValueError, match="ttft_deadline"):
        fluidity_index([0.1], -1.0, 0.05)


def _oracle(itt, d_p, d_d, exact):
    """Per-token transcription of docs/metrics.md §2 (floats, or integer nanoseconds)."""
    if exact:
        itt = [round(t * 1e9) for t in itt]
        d_p, d_d = round(d_p * 1e9), round(d_d * 1e9)
    slack = 0
    missed = total = 0
    for i, t in enumerate(itt):
        d = d_p if i == 0 else d_d
        if t <= d + slack:
            slack += d - t
            total += 1
            continue
        misses = 1 + (t - slack - d) // d_d if i == 0 else (t - slack) // d_d
        missed += int(misses)
        total += int(misses)
        slack = 0
    return missed, total


gap = st.one_of(
    st.sampled_from([0.0, 0.01, 0.02, 0.03, 0.05, 0.1, 0.15, 0.3]),
    st.floats(0.0, 0.5, allow_nan=False),
)


@settings(max_examples=200, deadline=None)
@given(
    lists=st.lists(st.lists(gap, max_size=30), min_size=1, max_size=8),
    d_p=st.sampled_from([0.0, 0.05, 0.1, 0.25]),
    d_d=st.sampled_from([0.01, 0.03, 0.05, 0.1]),
    exact=st.booleans(),
)
def test_lock_step_kernel_matches_the_per_token_oracle(lists, d_p, d_d, exact):
    missed, total = fl.deadline_counts(fl.Ragged.from_lists(lists), d_p, d_d, exact)
    for i, itt in enumerate(lists):
        assert (missed[i], total[i]) == _oracle(itt, d_p, d_d, exact)
        assert 0 <= missed[i] <= total[i]
        index = fluidity_index(itt, d_p, d_d, exact)
        assert index[1:] == (missed[i], total[i])
        assert math.isclose(index[0], 1 - missed[i] / total[i] if total[i] else 1.0)


def _plain_bisection(gaps, target, d_p, exact, first_is_prefill):
    """Etalon's bisection replaying every request's gaps at every probe (the reference)."""
    n = gaps.lengths.shape[0]
    d_p = np.broadcast_to(np.asarray(d_p, dtype=np.float64), (n,))
    left, right, best = np.zeros(n), np.full(n, fl.SEARCH_HIGH), np.full(n, fl.SEARCH_HIGH)
    while (rows := np.flatnonzero(right - left > fl.SEARCH_GRANULARITY)).size:
        mid = (left[rows] + right[rows]) / 2
        missed, total = fl.deadline_counts(gaps.take(rows), d_p[rows], mid, exact, first_is_prefill)
        fails = fl._rate(missed, total) > target
        left[rows[fails]] = mid[fails] + fl.SEARCH_GRANULARITY
        best[rows[~fails]] = mid[~fails]
        right[rows[~fails]] = mid[~fails] - fl.SEARCH_GRANULARITY
    return best


@settings(max_examples=60, deadline=None)
@given(
    lists=st.lists(
        st.lists(st.floats(0.0, 3.0, allow_nan=False), min_size=0, max_size=12),
        min_size=1,
        max_size=8,
    ),
    target=st.sampled_from([0.0, 0.1, 0.5]),
    d_p=st.floats(0.0, 2.0),
    exact=st.booleans(),
    first_is_prefill=st.booleans(),
)
def test_minimum_deadline_skips_probes_without_changing_the_answer(
    lists, target, d_p, exact, first_is_prefill
):
    gaps = fl.Ragged.from_lists(lists)
    got = fl.min_tbt_deadline(gaps, target, d_p, exact, first_is_prefill)
    want = _plain_bisection(gaps, target, d_p, exact, first_is_prefill)
    np.testing.assert_array_equal(got, want)


def test_exact_arithmetic_survives_the_searchs_huge_probes():
    """A request whose prefill misses D_p fails every probe up to 1e10 s; in nanoseconds those
    probes would overflow int64, so exact mode caps them and agrees with float mode."""
    gaps = fl.Ragged.from_lists([[1.0], [1.0, 0.02, 0.02]])
    with np.errstate(all="raise"):
        exact = fl.min_tbt_deadline(gaps, 0.0, ttft_deadline=0.0, exact=True)
    floats = fl.min_tbt_deadline(gaps, 0.0, ttft_deadline=0.0, exact=False)
    np.testing.assert_array_equal(exact, floats)
    assert exact[0] == fl.SEARCH_HIGH


decode_lists = st.lists(st.lists(gap, max_size=40), min_size=1, max_size=10)


@settings(max_examples=150, deadline=None)
@given(
    lists=decode_lists,
    deadlines=st.lists(
        st.sampled_from([0.001, 0.01, 0.02, 0.03, 0.05, 0.1, 0.0173, 1e10]), min_size=10
    ),
    exact=st.booleans(),
)
def test_decode_counts_from_records_match_the_token_walk(lists, deadlines, exact):
    """The records of the slack recursion give the walk's counts, ties included (gaps drawn
    from decimal multiples of the deadlines, where float and exact arithmetic differ)."""
    gaps = fl.Ragged.from_lists(lists)
    d = np.array(deadlines[: len(lists)])
    got = fl.DecodeProbes(gaps, exact).counts(np.arange(len(lists)), d)
    want = fl.deadline_counts(gaps, 0.0, d, exact, first_is_prefill=False)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@settings(max_examples=60, deadline=None)
@given(lists=decode_lists, exact=st.booleans())
def test_miss_rates_at_every_tbt_target_match_the_token_walk(lists, exact):
    gaps = fl.Ragged.from_lists(lists)
    targets = np.array([0.001, 0.0173, 0.01, 0.05, 0.03, 0.1, 0.02])  # unsorted on purpose
    rates = fl.decode_miss_rates(gaps, targets, exact)
    for t, d in enumerate(targets):
        missed, total = fl.deadline_counts(gaps, 0.0, d, exact, first_is_prefill=False)
        np.testing.assert_array_equal(rates[t], fl._rate(missed, total))


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), max_size=30), max_values=st.integers(1, 20))
def test_blocks_hold_every_row_once_and_at_most_max_values_unless_alone(lengths, max_values):
    gaps = fl.Ragged(np.arange(sum(lengths), dtype=np.float64), np.array(lengths, dtype=np.int64))
    rows = []
    for sl, block in gaps.blocks(max_values):
        rows.extend(range(sl.start, sl.stop))
        np.testing.assert_array_equal(block.lengths, gaps.lengths[sl])
        np.testing.assert_array_equal(block.values, gaps.take(np.arange(sl.start, sl.stop)).values)
        assert block.values.sum() == 0 or np.shares_memory(block.values, gaps.values)
        assert block.values.size <= max_values or sl.stop - sl.start == 1
    assert rows == list(range(len(lengths)))


@settings(max_examples=30, deadline=None)
@given(lists=decode_lists, exact=st.booleans(), block=st.integers(1, 40))
def test_rates_scored_in_blocks_are_the_rates_scored_at_once(lists, exact, block):
    """Scoring requests a block at a time (to bound memory) changes no answer."""
    gaps = fl.Ragged.from_lists(lists)
    whole_rate = fl.fluid_token_rate(gaps, exact)
    whole_curve = fl.miss_rate_at_tbt_targets(gaps, exact=exact)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fl, "BLOCK_VALUES", block)
        assert [s for s, _ in gaps.blocks()] == [s for s, _ in gaps.blocks(block)]
        rate = fl.fluid_token_rate(gaps, exact)
        curve = fl.miss_rate_at_tbt_targets(gaps, exact=exact)
    assert rate == whole_rate or (math.isnan(rate) and math.isnan(whole_rate))
    np.testing.assert_array_equal(curve.to_numpy(), whole_curve.to_numpy())
