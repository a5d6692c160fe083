"""Prefix-locality scheduling: longest prefix match (LPM) and its fair form, DLPM.

LPM (SGLang's cache-aware policy): of the waiting requests, try the one whose prompt has the
longest match in the replica's prefix cache, ties in arrival order (among the oldest 128: see
WINDOW). It maximises cache hits and
knows nothing of clients, so a client whose prompts share nothing waits while others with shared
prefixes keep arriving.

DLPM (Cao et al., "Locality-aware Fair Scheduling in LLM Serving", arXiv 2501.14312, the DLPM
algorithm): LPM order restricted to clients in credit. Each client holds a deficit counter q_c,
starting at 0. Requests are tried in LPM order, skipping clients with q_c <= 0; when no waiting
client has q_c > 0, every waiting client is refilled by the quantum Q (as many rounds at once as
the least indebted needs to turn positive). Service is charged as it is done, VTC's linear
prices: w_p per prompt token computed (cache hits are free: locality is rewarded) and w_q per
output token after the first.

Where I had to choose:
- Refills go only to clients with requests waiting (a deficit scheduler's idle client banks
  nothing); a client's counter is never reset.
- Prices are VTC's (w_p = 1, w_q = 2 by default), so DLPM's service is comparable with VTC's.
- The quantum (default 10,000) trades locality for fairness: a client in credit keeps its turn
  for about Q of service, so a larger Q batches more of its cache-sharing requests (closer to
  LPM) and loosens the bound 2 (U' + Q). On the built-in mix with 8 clients' 4,000-token system
  prompts and a 16,000-token pool, throughput over VTC's is 1.11x at Q = 2,000, 1.37x at 10,000
  and 1.45x at 40,000 (LPM: 1.45x).
- The bound tested (tests/test_locality.py): for two clients backlogged over an interval, refills
  reach both equally, and a counter stays within [-U', Q] (a client is picked only in credit,
  refills stop at the first positive counter, and U' is the most its running requests still
  owe right after one of its admissions), so their service differs by at most 2 (U' + Q).

The cache is the engine's (`ReplicaView`, engine=vllm with prefix caching); one policy per
replica, so behind a dispatcher these need a per-replica queue.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.base import BasePolicy
from policies.drr import DRR
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.seam import Admission, ReplicaView, Verdict
from traces.schema import Trace

# waiting requests LPM ranks by match, oldest first: SGLang ranks up to 128 and falls back to
# FCFS beyond; here the oldest 128 stay ranked, which bounds the cost of a pick under overload
WINDOW = 128


class PrefixAware:
    """The replica's prefix cache, seen by a locality-aware policy. The window's ranking is
    kept while neither the window nor a match in it can have changed (`_ranking_stands`): under
    overload most picks find the pool full and change nothing, and ranking 128 requests at
    every pick cost LPM 11x and DLPM 16x FCFS's time on the overloaded prefix-heavy mix, and
    3.6x and 4.4x on poisson_chat (benchmarks/policy_overload.py)."""

    runs_live = False  # not made to run live (DLPM would otherwise inherit DRR's True)

    name: str
    cache: ReplicaView | None = None
    # what the ranking was made of: the queue's changes at the front and pushes, its length,
    # and the cache's match version (None: nothing ranked yet)
    _ranked_from: tuple[int, int, int, int] | None = None
    _ranked: list[int]
    # minus each request's match, while the cache's match version is _matched_at: re-ranking
    # looks up what it has seen instead of asking the cache again (an admitted request's
    # entry goes: preempted, it comes back with a longer prompt)
    _matches: dict[int, int]
    _matched_at: int

    def forget_ranking(self) -> None:
        """A fresh run (`bind`): nothing ranked, no match seen."""
        self._ranked_from, self._ranked, self._matches, self._matched_at = None, [], {}, -1

    def admitted(self, req: int) -> None:
        self._matches.pop(req, None)

    def see_replica(self, view: ReplicaView) -> None:
        if self.cache is not None and self.cache is not view:
            raise ConfigError(
                f"policy {self.name} keeps one queue per replica: use a per-replica dispatcher "
                "(round_robin, client_affinity, least_requests, least_tokens), not central or "
                "global_vtc"
            )
        self.cache = view

    def ranked_window(self, queue: WaitingQueue) -> list[int]:
        """The oldest WINDOW waiting requests, longest cached prefix first, ties in arrival
        order (the caller must not change the list). LPM takes the first; DLPM the first
        of a client in credit."""
        if self.cache is None:
            raise ConfigError(
                f"policy {self.name} needs a prefix cache: engine=vllm (enable_prefix_caching)"
            )
        if not self._ranking_stands(queue):
            version = self.cache.match_version()
            if version != self._matched_at:
                self._matches.clear()
                self._matched_at = version
            matches, cached = self._matches, self.cache.cached_tokens
            window = queue.in_order(WINDOW)
            for req in [r for r in window if r not in matches]:  # usually the newest one
                matches[req] = -cached(req)
            self._ranked = sorted(window, key=matches.__getitem__)  # stable: ties in age
            self._ranked_from = self._ranking_state(queue)
        return self._ranked

    def _ranking_state(self, queue: WaitingQueue) -> tuple[int, int, int, int]:
        assert self.cache is not None
        return queue.front_changes, queue.pushed, len(queue), self.cache.match_version()

    def _ranking_stands(self, queue: WaitingQueue) -> bool:
        """Whether the oldest WINDOW waiting requests and their matches are those ranked:
        nothing left or rejoined at the front, the cache changed no match, and requests were
        pushed at the back only if WINDOW were already waiting."""
        if self._ranked_from is None:
            return False
        front, pushed, length, version = self._ranked_from
        now_front, now_pushed, _, now_version = self._ranking_state(queue)
        return (
            now_front == front
            and now_version == version
            and (now_pushed == pushed or length >= WINDOW)
        )


class LPM(PrefixAware, BasePolicy):
    name = "lpm"

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        self.cache = None
        self.forget_ranking()

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        return self.ranked_window(queue)[0] if len(queue) else None

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        if not fits:
            return Verdict.WAIT
        self.admitted(req)
        return Verdict.ADMIT


class DLPM(PrefixAware, DRR):
    name = "dlpm"

    def __init__(
        self,
        quantum: float = 10_000.0,
        input_price: float = 1.0,
        output_price: float = 2.0,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(quantum, input_price, output_price, weights, "linear")

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        self.cache = None
        self.forget_ranking()
        self._client_of: list[int] = trace.client.tolist()

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        if not len(queue):
            return None
        credit, client = self.credit, self._client_of
        for req in self.ranked_window(queue):  # a client in credit there: no refill is due
            if credit[client[req]] > 0:
                return req
        waiting = self.refill_when_all_spent(queue, now)
        for req in self.ranked_window(queue):
            if credit[client[req]] > 0:
                return req
        # past the window, arrival order: the first request of a client in credit is the
        # earliest of those clients' heads (each has none in the window, or it was found there)
        earliest = queue.earliest_head([c for c in waiting if credit[c] > 0])
        if earliest is None:
            raise AssertionError("a refill leaves some waiting client in credit")
        return earliest

    def refill_when_all_spent(self, queue: WaitingQueue, now: float) -> list[int]:
        """The clients waiting, every one refilled first if none is in credit (as many rounds
        as the least indebted needs)."""
        waiting = queue.waiting_clients()
        if all(self.credit[c] <= 0 for c in waiting):
            rounds = min(self._refills_needed(c) for c in waiting)
            for c in waiting:
                self._refill(c, rounds, now)
        return waiting

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        verdict = super().admit(req, now, fits)
        if verdict is Verdict.ADMIT:
            self.admitted(req)
        return verdict
