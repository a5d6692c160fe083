"""LPM and DLPM keep their ranking of the waiting window, and the block pool keeps each waiting
request's cached match, instead of recomputing them at every pick (policies/lpm.py,
simulator/engines/kv_blocks.py); Andes keeps its waiting requests' values by phase
(policies/andes_index.py) instead of valuing the whole queue at every pick and step: the
decisions must be bit for bit those of the plain implementations, which did."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import a10g_cost
from policies import DLPM, LPM, Andes
from policies.lpm import WINDOW
from simulator.api import build_trace, compose_config
from simulator.core.queue import WaitingQueue
from simulator.engines import VLLMConfig, simulate
from simulator.engines.kv_blocks import BlockPool
from traces import PrefixHeavyMix, Trace


def plain_order(policy, queue: WaitingQueue) -> list[int]:
    """The order as it was: every match looked up again (an untracked walk of the request's
    keys), the oldest WINDOW sorted by it, then the rest in arrival order; and the pool's
    tracked match of each ranked request checked against that walk."""
    engine = policy.cache
    ranked = sorted(queue.in_order(WINDOW), key=lambda req: -engine.cached_tokens_now(req))
    for req in ranked:
        assert engine.cached_tokens(req) == engine.cached_tokens_now(req), req
    return ranked + queue.in_order()[WINDOW:]


class PlainLPM(LPM):
    def pick(self, queue, now):
        return plain_order(self, queue)[0] if len(queue) else None


class PlainDLPM(DLPM):
    def pick(self, queue, now):
        if not len(queue):
            return None
        self.refill_when_all_spent(queue, now)
        return next(r for r in plain_order(self, queue) if self.credit[self.trace.client[r]] > 0)


class PlainAndes(Andes):
    """Andes as it was: every waiting request valued at every pick and every step."""

    def _ranked(self, rows: list[int], now: float) -> list[int]:
        density = self.values(rows, now) / self._blocks(rows)
        return [rows[i] for i in np.argsort(-density, kind="stable")]

    def reschedule(self, running, queue, now):
        if self.max_preempt == 0 or not self._pressed():
            return []
        waiting = queue.in_order()
        best_waiting = float(self.values(waiting, now).max())
        run_values = self.values(running, now)
        order = np.argsort(run_values, kind="stable")
        movable = [
            running[i]
            for i in order
            if run_values[i] <= best_waiting
            and self.preempted[running[i]] < self.preemptions_per_request
        ][: self.max_preempt]
        if not movable:
            return []
        keep = [r for r in running if r not in movable]
        capacity = self.view.kv_blocks()[1] - (int(self._blocks(keep).sum()) if keep else 0)
        ranked = self._ranked(movable + waiting, now)
        taken, used = set(), 0
        for req, need in zip(ranked, self._blocks(ranked).tolist()):
            if used + need <= capacity:
                used += need
                taken.add(req)
            elif used >= 0.9 * capacity:
                break
        victims = [r for r in movable if r not in taken]
        self.preempted[victims] += 1
        return victims

    def victim(self, running):
        return running[-1]

    def pick(self, queue, now):
        if not len(queue):
            return None
        if not self._pressed():
            return queue.oldest()
        return self._ranked(queue.in_order(), now)[0]


def assert_same_decisions(a, b) -> None:
    for name in ("status", "reason", "admitted_at", "first_token_at", "finished_at", "generated"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for key in a.steps:
        np.testing.assert_array_equal(a.steps[key], b.steps[key], err_msg=key)


OVERLOADED_PREFIXES = PrefixHeavyMix(duration=15, rate=4.0)  # a queue of hundreds, hits and misses
CALM_PREFIXES = PrefixHeavyMix(duration=60, rate=0.5)
NO_PREFIXES = "poisson_chat"  # no block hashes: every match is 0


@pytest.mark.parametrize("policy", [LPM, DLPM], ids=["lpm", "dlpm"])
@pytest.mark.parametrize(
    ("workload", "pool"),
    [(OVERLOADED_PREFIXES, 16_000), (CALM_PREFIXES, 16_000), (NO_PREFIXES, 20_000)],
    ids=["prefix-heavy-overloaded", "prefix-heavy", "poisson-chat-overloaded"],
)
def test_the_kept_ranking_makes_the_plain_rankings_decisions(policy, workload, pool):
    if workload == NO_PREFIXES:
        overrides = ["workload=poisson_chat", "workload.rate_scale=8", "workload.duration=40"]
        trace = build_trace(compose_config([*overrides, "seed=3"]))
    else:
        trace = workload.build(3)
    engine = VLLMConfig(pool_tokens=pool, max_num_batched_tokens=2048)
    plain = PlainLPM() if policy is LPM else PlainDLPM()
    expected = simulate(trace, plain, a10g_cost(), engine)
    got = simulate(trace, policy(), a10g_cost(), engine)
    assert_same_decisions(expected, got)


FAST_FIRST_CLIENT = {"expected_ttft": 0.5, "reading_speed": 8.0}  # the others: the defaults
POISSON_CHAT = ["workload=poisson_chat", "workload.duration=40"]
ARENA = ["workload=arena_like", "workload.duration=40"]  # 27 clients


@pytest.mark.parametrize(
    ("workload", "pool", "andes"),
    [
        ([*POISSON_CHAT, "workload.rate_scale=8"], 20_000, {}),
        ([*ARENA, "workload.total_rate=6"], 20_000, {"clients": FAST_FIRST_CLIENT}),
        (
            [*POISSON_CHAT, "workload.rate_scale=4"],
            30_000,
            {"max_preempt": 4, "preemptions_per_request": 3, "threshold": 0.7},
        ),
        (
            [*POISSON_CHAT, "workload.rate_scale=8"],
            12_000,
            {"expected_ttft": 0.0, "reading_speed": 30.0},  # reads faster than tokens come
        ),
    ],
    ids=["overloaded", "two-expectations", "preempting-more", "instant-fast-readers"],
)
def test_andes_kept_values_make_the_plain_valuations_decisions(workload, pool, andes):
    """Every pick, preemption and admission as when every waiting request is valued afresh
    (overloaded: thousands waiting, hundreds of them preempted with tokens in hand)."""
    trace = build_trace(compose_config([*workload, "seed=5"]))
    if "clients" in andes:
        andes = {"clients": {trace.client_names[0]: andes["clients"]}}
    engine = VLLMConfig(pool_tokens=pool, max_num_batched_tokens=2048)
    expected = simulate(trace, PlainAndes(**andes), a10g_cost(), engine)
    got = simulate(trace, Andes(**andes), a10g_cost(), engine)
    assert int(np.sum(expected.steps["preempted"])) > 0  # the knapsack was exercised
    assert_same_decisions(expected, got)


class FullPool:
    """A replica whose pool is always past Andes's threshold, 16 tokens a block."""

    block_size = 16

    def cached_tokens(self, req: int) -> int:
        return 0

    def match_version(self) -> int:
        return 0

    def kv_blocks(self) -> tuple[int, int]:
        return 1000, 1000


@pytest.mark.parametrize("seed", range(3))
def test_andes_waiting_values_rank_as_valuing_the_whole_queue_does(seed):
    """Arrivals, admissions from anywhere in the queue and preempted requests put back with
    tokens in hand, over 400 simulated seconds: at every time, the kept ranking lists every
    waiting request of positive value per KV block in the order (ties: queue order) and with
    the densities of valuing the whole queue, and the best value is its maximum; and the
    knapsack keeps the running requests that valuing everything keeps, whatever its room."""
    rng = np.random.default_rng(seed)
    n = 600
    trace = Trace.from_columns(
        client=rng.choice(["fast", "slow", "instant"], n),
        # equal arrivals and lengths, and tokens in hand in steps of 32: ties in value
        arrival=np.sort(rng.uniform(0, 300, n)).round(0),
        prompt_len=rng.choice([40, 400, 1500], n),
        output_len=rng.integers(1, 600, n),
    )
    per_client = {"fast": {"reading_speed": 12.0, "expected_ttft": 0.3},
                  "instant": {"reading_speed": 40.0, "expected_ttft": 0.0}}  # fmt: skip
    policy = Andes(clients=per_client)
    policy.bind(trace)
    policy.see_replica(FullPool())
    queue = WaitingQueue(list(trace.client))
    arrived, checked, running = 0, 0, []
    for now in np.cumsum(rng.exponential(0.7, 600)):
        while arrived < n and trace.arrival[arrived] <= now:
            policy.on_arrival(arrived, float(trace.arrival[arrived]), queue)
            queue.push(arrived)
            arrived += 1
        waiting = queue.in_order()
        for req in waiting:
            if rng.random() < 0.03:  # admitted: it runs a while, and may be preempted
                queue.remove(req)
                policy.generated[req] += 32 * rng.integers(1, 4)
                if rng.random() < 0.5:
                    policy.waiting.entered(req)
                    queue.push_front(req)
                else:
                    running.append(req)
        waiting = queue.in_order()
        if not waiting:
            continue
        density = policy.values(waiting, now) / policy._blocks(waiting)
        order = np.argsort(-density, kind="stable")
        expected = [(density[i], waiting[i]) for i in order if density[i] > 0]
        ranked = policy.waiting.ranked(queue, now)
        assert list(ranked) == expected
        assert policy.waiting.best_value(queue, now) == policy.values(waiting, now).max()
        # the knapsack: two running requests against the queue, room from none to plenty
        movable = (
            [int(r) for r in rng.choice(running, 2, replace=False)] if len(running) > 1 else []
        )
        if movable:
            ranked = movable + waiting
            moving = policy.values(movable, now) / policy._blocks(movable)
            order = np.argsort(-np.concatenate([moving, density]), kind="stable")
            needs = policy._blocks(ranked)
            for capacity in rng.integers(-5, 150, 6).tolist():
                plain, used = set(), 0
                for i in order.tolist():
                    if used + needs[i] <= capacity:
                        used += needs[i]
                        plain.add(ranked[i])
                    elif used >= 0.9 * capacity:
                        break
                got = policy._fill(movable, moving.tolist(), capacity, queue, now)
                assert got == plain & set(movable), (now, capacity)
        checked += len(expected) > 0
    assert checked > 100


def test_andes_knapsack_stops_at_a_request_it_passed_over_the_group_of():
    """A group of waiting requests too big for the room left is passed over as a whole; once
    the knapsack is 90% full, its next member is still the next request, which does not fit
    and ends the knapsack before the running request ranked after it (capacity 10 blocks:
    take A (1 block), pass B1 (10), take C (8): 9 used; B2 (10) ends it; M (1) stays out)."""
    now = 200.0
    ages = {"M": 150, "A": 30, "B2": 30, "C": 13, "B1": 10}  # seconds since arrival
    trace = Trace.from_columns(
        client=["c"] * 5,
        arrival=[now - age for age in ages.values()],
        prompt_len=[1, 1, 150, 120, 150],  # KV blocks: 1, 1, 10, 8, 10
        output_len=[10] * 5,
    )
    m, a, b2, c, b1 = range(5)
    policy = Andes()
    policy.bind(trace)
    policy.see_replica(FullPool())
    queue = WaitingQueue(list(trace.client))
    for req in range(5):
        policy.on_arrival(req, float(trace.arrival[req]), queue)
        if req != m:
            queue.push(req)
    density = policy.values(list(range(5)), now) / policy._blocks(list(range(5)))
    assert list(np.argsort(-density)) == [a, b1, c, b2, m]  # the ranking the story needs
    assert [d for _, d in policy.waiting.ranked(queue, now)] == [a, b1, c, b2]
    assert policy._fill([m], [float(density[m])], 10, queue, now) == set()
    assert policy._fill([m], [float(density[m])], 40, queue, now) == {m}  # room for all


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["admit", "grow", "release", "ask"]), st.integers(0, 11)),
        min_size=1,
        max_size=120,
    )
)
def test_a_tracked_match_always_equals_a_fresh_walk_of_the_cache(ops):
    """Random admissions (which register prompt blocks), growth (which evicts), releases and
    lookups on a small pool: every tracked match equals cached_prefix at every moment."""
    pool = BlockPool(num_blocks=24, block_size=4, caching=True)
    # 12 requests over 3 prefix families: keys shared up to a point, then private
    keys = {r: [r % 3 * 100 + j if j < 4 else 1000 * r + j for j in range(8)] for r in range(12)}
    prompt = 8 * 4
    running: set[int] = set()
    for op, req in ops:
        if op == "ask" and req not in running:
            pool.tracked_prefix(req, keys[req], prompt)
        elif op == "admit" and req not in running:
            hit = pool.cached_prefix(keys[req], prompt)
            if pool.fits(keys[req], hit, prompt, 0):
                pool.admit(req, keys[req], hit, prompt, 0)
                pool.register(req, keys[req], prompt)
                running.add(req)
        elif op == "grow" and req in running:
            pool.grow(req, prompt + 4 * (1 + req % 3))
        elif op == "release" and req in running:
            pool.release(req)
            running.discard(req)
        for tracked, n in pool.tracked.items():
            assert tracked not in running
            assert n == pool.cached_prefix(keys[tracked], prompt), (tracked, op, req)
        pool.check()
