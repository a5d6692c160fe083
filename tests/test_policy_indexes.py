"""LPM and DLPM keep their ranking of the waiting window, and the block pool keeps each waiting
request's cached match, instead of recomputing them at every pick (policies/lpm.py,
simulator/engines/kv_blocks.py): the decisions must be bit for bit those of the plain
implementation, which looked every match up again and sorted the window at every pick."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import a10g_cost
from policies import DLPM, LPM
from policies.lpm import WINDOW
from simulator.api import build_trace, compose_config
from simulator.core.queue import WaitingQueue
from simulator.engines import VLLMConfig, simulate
from simulator.engines.kv_blocks import BlockPool
from traces import PrefixHeavyMix


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
