from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import a10g_cost, check_accounting, random_trace
from cost_models import ConstantStepCost
from policies import FCFS
from simulator.core.requests import COMPLETED, IN_FLIGHT, REFUSED, STATUSES
from simulator.core.timeline import PREFILL
from simulator.engines import SLoRAConfig, simulate
from simulator.engines.fit import BatchFit, RunningFit, peak_kv_need
from traces import Trace

CONST = ConstantStepCost(prefill=0.1, decode=0.01)


def trace(arrival, prompt, output, client=None):
    n = len(arrival)
    return Trace.from_columns(
        client=client or ["a"] * n, arrival=arrival, prompt_len=prompt, output_len=output
    )


def check_invariants(tl, cfg):
    """Accounting, token conservation, ordering and memory, for any run."""
    check_accounting(tl)
    assert (tl.steps["kv_used"] <= cfg.pool_tokens).all()
    assert (tl.steps["start"][1:] >= tl.steps["end"][:-1]).all(), "steps never overlap"
    if cfg.horizon is None:
        assert not (tl.status == IN_FLIGHT).any()
        assert tl.info["kv_used_at_end"] == 0


workloads = st.builds(
    random_trace,
    seed=st.integers(0, 10_000),
    n=st.integers(1, 120),
    clients=st.integers(1, 4),
    max_prompt=st.sampled_from([8, 64, 300]),
    max_output=st.sampled_from([1, 4, 64, 300]),
    rate=st.sampled_from([0.5, 5.0, 50.0]),
)
engines = st.builds(
    SLoRAConfig,
    pool_tokens=st.sampled_from([700, 2000, 10_000]),
    max_wait_tokens=st.sampled_from([0, 1, 10]),
    batch_max_tokens=st.sampled_from([300, 3072]),
    running_max_req_size=st.sampled_from([1, 3, 1000]),
    reserve_per_client=st.sampled_from([0, 32]),
    horizon=st.sampled_from([None, None, 5.0]),
    step_jitter_cv=st.sampled_from([0.0, 0.0, 0.3]),  # fast-forward draws stepping's factors
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, engines)
def test_invariants_hold_on_random_workloads(tr, cfg):
    check_invariants(simulate(tr, FCFS(), a10g_cost(), cfg), cfg)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, engines)
def test_fast_forward_is_bit_identical_to_stepping(tr, cfg):
    from dataclasses import replace

    fast = simulate(tr, FCFS(), a10g_cost(), replace(cfg, fast_forward=True))
    slow = simulate(tr, FCFS(), a10g_cost(), replace(cfg, fast_forward=False))
    for name in ("status", "reason", "admitted_at", "first_token_at", "finished_at", "generated"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)
    for name in fast.steps:
        np.testing.assert_array_equal(fast.steps[name], slow.steps[name], err_msg=name)
    for a, b in zip(fast.token_times(), slow.token_times()):
        np.testing.assert_array_equal(a, b)


def test_peak_kv_need_hand_computed():
    # sorted by remaining: (10, 5), (20, 3): max(5*1 + 10, 3*2 + 30) = 36
    assert peak_kv_need(np.array([20, 10]), np.array([3, 5])) == 36
    # ties in remaining: order does not matter, 4*2 + 30 = 38
    assert peak_kv_need(np.array([10, 20]), np.array([4, 4])) == 38


@pytest.mark.parametrize(
    ("clients", "reserve", "pool", "together"),
    [
        # two newcomers (41, 9) each: need = max(9 + 41, 9*2 + 82) = 100
        (["a", "a"], 0, 101, True),
        (["a", "a"], 0, 100, False),  # need must be strictly below the pool
        (["a", "a"], 1, 102, True),  # one client: 100 < 102 - 1
        (["a", "b"], 1, 102, False),  # two clients reserve 2: 100 < 100 fails
        (["a", "b"], 1, 103, True),
    ],
)
def test_fit_test_with_per_client_reservation(clients, reserve, pool, together):
    tr = trace([0.0, 0.0], [40, 40], [10, 10], clients)
    cfg = SLoRAConfig(pool_tokens=pool, reserve_per_client=reserve)
    tl = simulate(tr, FCFS(), CONST, cfg)
    first_batch = tl.steps["batch_size"][0]
    assert first_batch == (2 if together else 1)
    assert (tl.status == COMPLETED).all()


def test_requests_that_can_never_fit_are_refused_up_front():
    tr = trace([0.0, 1.0, 2.0], [50, 5000, 10], [50, 10, 10])
    tl = simulate(tr, FCFS(), CONST, SLoRAConfig(pool_tokens=100, batch_max_tokens=3072))
    assert tl.status.tolist() == [REFUSED, REFUSED, COMPLETED]
    assert tl.reason[:2].tolist() == ["kv_pool_too_small", "kv_pool_too_small"]
    tl = simulate(trace([0.0], [400], [5]), FCFS(), CONST, SLoRAConfig(batch_max_tokens=300))
    assert tl.reason[0] == "prompt_exceeds_batch_max_tokens"


def test_idle_engine_ttft_is_one_prefill_and_e2e_closed_form():
    n, out = 20, 50
    tr = trace(list(np.arange(n) * 10.0), [100] * n, [out] * n)
    tl = simulate(tr, FCFS(), CONST, SLoRAConfig())
    np.testing.assert_allclose(tl.first_token_at - tr.arrival, 0.1)
    np.testing.assert_allclose(tl.finished_at - tr.arrival, 0.1 + (out - 1) * 0.01)
    cost = a10g_cost()
    tl = simulate(tr, FCFS(), cost, SLoRAConfig())
    np.testing.assert_allclose(tl.first_token_at - tr.arrival, cost.prefill_time(np.array([100])))


def test_max_wait_cadence_and_prefill_only_steps():
    # A prefills [0, 0.1]; decodes 10 steps to 0.2; then B (arrived 0.05) is prefilled alone in
    # [0.2, 0.3] while A makes no progress; both then decode together.
    tl = simulate(trace([0.0, 0.05], [10, 10], [30, 5]), FCFS(), CONST, SLoRAConfig())
    assert tl.first_token_at[1] == pytest.approx(0.3)
    rows, index, times = tl.token_times()
    a = times[rows == 0]
    np.testing.assert_allclose(a[:12], [0.1, *(0.1 + 0.01 * np.arange(1, 11)), 0.31])
    b = times[rows == 1]
    np.testing.assert_allclose(b, [0.3, 0.31, 0.32, 0.33, 0.34])
    kinds = tl.steps["kind"]
    assert kinds[0] == PREFILL and kinds[11] == PREFILL and (kinds[1:11] != PREFILL).all()


def test_scheduler_is_asked_every_step_after_the_wait():
    # B arrives at 0.255, after the 10-step wait ended at 0.2: admitted at the next step end 0.26
    tl = simulate(trace([0.0, 0.255], [10, 10], [40, 5]), FCFS(), CONST, SLoRAConfig())
    assert tl.admitted_at[1] == pytest.approx(0.26)


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_full_batch_is_not_offered_to_the_scheduler(fast_forward):
    # one running request at most (running_max_req_size=1) and the scheduler asked every step
    # (max_wait_tokens=0): as S-LoRA's generate_new_batch returns at once on a full batch, the
    # policy picks at 0 (A, admitted; then B, which does not fit) and once A has finished (B),
    # never while A decodes (a stateful pick such as DRR's refills made stepping and runs differ)
    picks = []

    class CountingFCFS(FCFS):
        def pick(self, queue, now):
            picks.append(now)
            return super().pick(queue, now)

    cfg = SLoRAConfig(max_wait_tokens=0, running_max_req_size=1, fast_forward=fast_forward)
    tl = simulate(trace([0.0, 0.0], [10, 10], [30, 5]), CountingFCFS(), CONST, cfg)
    assert (tl.status == COMPLETED).all()
    assert picks == pytest.approx([0.0, 0.0, tl.finished_at[0]])


@pytest.mark.slow
def test_mdl_queue_mean_wait_matches_pollaczek_khinchine():
    """One request at a time, deterministic service S, Poisson arrivals: an M/D/1 queue.

    Mean time in queue W = rho * S / (2 (1 - rho)); TTFT = W + prefill.
    """
    rng = np.random.default_rng(0)
    n, out = 40_000, 30
    s = 0.1 + (out - 1) * 0.01  # service time 0.39 s
    lam = 0.7 / s
    arrival = np.cumsum(rng.exponential(1 / lam, n))
    tr = trace(list(arrival), [10] * n, [out] * n)
    tl = simulate(tr, FCFS(), CONST, SLoRAConfig(running_max_req_size=1))
    rho = lam * s
    expected = rho * s / (2 * (1 - rho)) + 0.1
    measured = float(np.mean(tl.first_token_at - tr.arrival))
    assert measured == pytest.approx(expected, rel=0.05)


def test_horizon_leaves_requests_in_flight_with_where_they_were():
    tr = trace([0.0, 0.0, 3.0, 100.0], [10, 10, 10, 10], [500, 2, 500, 5])
    cfg = SLoRAConfig(horizon=2.0, running_max_req_size=1)
    tl = simulate(tr, FCFS(), CONST, cfg)
    assert [STATUSES[s] for s in tl.status] == ["in_flight", "in_flight", "in_flight", "in_flight"]
    assert tl.reason.tolist() == ["running", "queued", "not_arrived", "not_arrived"]
    assert (tl.steps["start"] < 2.0).all()
    assert tl.generated[0] == 1 + int(round((2.0 - 0.1) / 0.01))
    check_invariants(tl, cfg)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 500), st.integers(0, 50), st.integers(1, 400)), max_size=30),
    st.lists(st.tuples(st.integers(1, 500), st.integers(1, 400)), min_size=1, max_size=8),
    st.integers(0, 60),
    st.sampled_from([BatchFit.MAX_CLOSED_FORM, 2]),
)
def test_fast_fit_equals_the_direct_formula(running, newcomers, extra, closed_form_limit):
    """RunningFit's closed form (and its large-batch fallback) equals S-LoRA's sort-and-scan."""
    prompt = np.array([r[0] for r in running], dtype=np.int64)
    first = np.array([r[1] for r in running], dtype=np.int64)
    output = np.array([r[2] for r in running], dtype=np.int64)
    finish = first + output - 1
    decodes = int(first.max(initial=0)) + extra  # every request already admitted
    fit = RunningFit(prompt, first, finish)  # built before some finished: must stay valid
    alive = finish > decodes
    prompt, first, finish = prompt[alive], first[alive], finish[alive]
    p = np.array([c[0] for c in newcomers], dtype=np.int64)
    o = np.array([c[1] for c in newcomers], dtype=np.int64)
    gen = decodes - first + 1
    direct = peak_kv_need(
        np.concatenate([prompt + gen, p + 1]), np.concatenate([finish - decodes - 1, o - 1])
    )

    def need_with(enough: int | None = None) -> int:
        """Peak need if the newcomers join now, in order: a mini-batch formed as the engine
        forms it, the last newcomer tested."""
        batch = fit.batch(decodes)
        for pi, oi in zip(p[:-1].tolist(), o[:-1].tolist(), strict=True):
            batch.add(pi, oi)
        return batch.need(int(p[-1]), int(o[-1]), enough)

    with patch.object(BatchFit, "MAX_CLOSED_FORM", closed_form_limit):
        assert need_with() == direct
        # the engine's early stop decides `need < limit` exactly as the full need does
        for limit in (direct - 1, direct, direct + 1):
            assert (need_with(enough=limit) < limit) == (direct < limit)
