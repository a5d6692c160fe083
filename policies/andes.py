"""Andes (Liu et al., "Andes: Defining and Enhancing Quality-of-Experience in LLM-Based Text
Streaming Services", arXiv 2404.16283): QoE-aware, token-level preemptive scheduling.

Each request's user expects its first token `expected_ttft` seconds after arrival and then reads
`reading_speed` tokens per second (per client: `clients`), the expectation the Andes QoE metric
of simulator/metrics/latency.py scores. A request's value is its QoE gain from being served
over the next `horizon` seconds rather than paused: the delay area (tokens the user expected but
did not have, integrated over the horizon) avoided by serving it, tokens coming every
`token_latency` seconds, over the area of the user's expected timeline so far (QoE's
normalisation, the paper's S_whole). A request whose user still has unread tokens gains nothing
from running now; one past its expected TTFT gains much.

While the KV pool is less than `threshold` full, nothing is preempted and requests are admitted
in arrival order. Beyond it, before each step, Andes solves the paper's knapsack greedily: the
running requests whose value is at most the best waiting value may be preempted (at most
`max_preempt` per step, the lowest values first: the safeguard against preempting too often),
and these and the waiting requests are taken by value per KV block until the blocks the other
running requests leave are full; the preemptable ones left out are preempted (vLLM's
recompute), and waiting requests are admitted in the same order.

The waiting requests' values are kept by phase (policies/andes_index.py): a pick or a step
values the few that could still be the best, not the whole queue, with the same decisions.

Where I had to choose: the value's closed form above (the paper states the objective, not this
discretisation); the constants (threshold 0.9, 2 preemptions per step, 50 tokens of horizon at
50 ms per token) are those of the authors' reference scheduler; preemption candidates are the
lowest-valued rather than the first in running order. Runs on engine=vllm only (it needs the
replica's KV use and preemption).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from policies.andes_index import Phases, Room, WaitingValues
from policies.base import BasePolicy
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.seam import Admission, Charge, OutputTokens, ReplicaView, Verdict
from traces.schema import Trace

GRID = 9  # points of the horizon the delay areas are integrated on (trapezoids)
# up to this many rows, `values` computes in plain floats: the array calls' own cost dominates
# (benchmarks/policy_overload.py, rate 10, one process alternating: 9.2-9.5 s with arrays only,
# 8.3 s so)
SCALAR_ROWS = 4
# seconds a phase boundary (`phases`) is moved to the safe side, far beyond float rounding
PHASE_MARGIN = 1e-6


class Andes(BasePolicy):
    name = "andes"
    charged = frozenset({OutputTokens})

    def __init__(
        self,
        expected_ttft: float = 1.0,
        reading_speed: float = 5.0,
        clients: Mapping[str, Mapping[str, float]] | None = None,
        horizon_tokens: int = 50,
        token_latency: float = 0.05,
        threshold: float = 0.9,
        max_preempt: int = 2,
        preemptions_per_request: int = 1,
    ) -> None:
        checks = (
            ("expected_ttft", expected_ttft, expected_ttft >= 0, "a number of seconds >= 0"),
            ("reading_speed", reading_speed, reading_speed > 0, "a number of tokens/s > 0"),
            ("horizon_tokens", horizon_tokens, horizon_tokens >= 1, "an integer >= 1"),
            ("token_latency", token_latency, token_latency > 0, "a number of seconds > 0"),
            ("threshold", threshold, 0 <= threshold <= 1, "a fraction in [0, 1]"),
            ("max_preempt", max_preempt, max_preempt >= 0, "an integer >= 0"),
            (
                "preemptions_per_request",
                preemptions_per_request,
                preemptions_per_request >= 0,
                "an integer >= 0",
            ),
        )
        for key, value, ok, accepted in checks:
            if not ok:
                raise ConfigError(f"policy.{key}={value!r}: expected {accepted}")
        self.expected_ttft, self.reading_speed = float(expected_ttft), float(reading_speed)
        self.per_client = {k: dict(v) for k, v in (clients or {}).items()}
        self.horizon = horizon_tokens * token_latency
        self.grid = np.linspace(0.0, self.horizon, GRID)  # the horizon's points, from now
        self.grid_points = self.grid.tolist()
        self.token_latency, self.threshold = float(token_latency), float(threshold)
        self.max_preempt = int(max_preempt)
        self.preemptions_per_request = int(preemptions_per_request)
        self.view: ReplicaView | None = None

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        ttft = np.full(trace.num_clients, self.expected_ttft)
        speed = np.full(trace.num_clients, self.reading_speed)
        for name, given in self.per_client.items():
            if name not in trace.client_names:
                raise ConfigError(
                    f"policy.clients: unknown client {name!r}; clients are "
                    f"{list(trace.client_names)}"
                )
            unknown = set(given) - {"expected_ttft", "reading_speed"}
            if unknown:
                raise ConfigError(
                    f"policy.clients[{name}]: unknown keys {sorted(unknown)}; accepted: "
                    "expected_ttft, reading_speed"
                )
            c = trace.client_names.index(name)
            ttft[c] = given.get("expected_ttft", ttft[c])
            speed[c] = given.get("reading_speed", speed[c])
        self.generated = np.zeros(len(trace), dtype=np.int64)  # tokens each request has emitted
        # each request's user: when the first token is expected (arrival + expected TTFT) and
        # the reading speed, gathered once per request rather than per client at every valuing
        self.expected_ttft_of, self.speed_of = ttft[trace.client], speed[trace.client]
        self.expected_ttft_of_client, self.reading_speed_of_client = ttft, speed
        self.first_expected = self.expected_ttft_of.copy()  # until it arrives: arrival 0
        self.preempted = np.zeros(len(trace), dtype=np.int64)  # times Andes preempted each
        self.view = None
        self.waiting = WaitingValues(self.values, self._blocks, self.phases, self.settled_value)

    def see_replica(self, view: ReplicaView) -> None:
        if self.view is not None and self.view is not view:
            raise ConfigError(
                "policy andes keeps one queue per replica: use a per-replica dispatcher "
                "(round_robin, client_affinity, least_requests, least_tokens)"
            )
        self.view = view

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        self.first_expected[req] = now + self.expected_ttft_of[req]
        self.waiting.entered(req)
        return None

    def charge(self, event: Charge) -> None:
        if isinstance(event, OutputTokens):
            np.add.at(self.generated, event.rows, event.step_ends.shape[0])

    # ---- the knapsack ----------------------------------------------------------------------
    def _pressed(self) -> bool:
        """The KV pool is `threshold` full: QoE decides from here on."""
        if self.view is None:
            raise ConfigError("policy andes needs engine=vllm (its KV use and preemption)")
        used, total = self.view.kv_blocks()
        return used >= self.threshold * total

    def values(self, rows: list[int], now: float) -> np.ndarray:
        """Each request's QoE gain from being served over the horizon instead of paused."""
        if len(rows) <= SCALAR_ROWS:
            return np.array([self._value(req, now) for req in rows], dtype=np.float64)
        r = np.asarray(rows, dtype=np.int64)
        start, speed, ttft = self.first_expected[r], self.speed_of[r], self.expected_ttft_of[r]
        have = self.generated[r].astype(np.float64)
        t = now + self.grid
        expected = np.maximum((t[None, :] - start[:, None]) * speed[:, None] + 1.0, 0.0)
        served = have[:, None] + (t - now) / self.token_latency
        gained = np.maximum(expected - have[:, None], 0.0) - np.maximum(expected - served, 0.0)
        pair = gained[:, 1:] + gained[:, :-1]  # the trapezoids, summed pairwise in a fixed order
        avoided = ((pair[:, 0] + pair[:, 1]) + (pair[:, 2] + pair[:, 3])) + (
            (pair[:, 4] + pair[:, 5]) + (pair[:, 6] + pair[:, 7])
        )
        avoided *= self.horizon / (GRID - 1) / 2
        k = expected[:, -1]  # tokens the user expects by the horizon's end
        whole = k * ttft + k * np.maximum(k - 1, 0.0) / (2 * speed)
        return np.divide(avoided, whole, out=np.zeros_like(avoided), where=whole > 0)

    def _value(self, req: int, now: float) -> float:
        """`values` of one request in plain floats, the same operations in the same order (bit
        for bit: tests/test_andes.py); a few rows cost several times less so than as arrays."""
        start, speed = float(self.first_expected[req]), float(self.speed_of[req])
        have = float(self.generated[req])
        latency, gained = self.token_latency, []
        for g in self.grid_points:
            t = now + g
            expected = max((t - start) * speed + 1.0, 0.0)
            served = have + (t - now) / latency
            gained.append(max(expected - have, 0.0) - max(expected - served, 0.0))
        pair = [gained[i + 1] + gained[i] for i in range(GRID - 1)]
        avoided = ((pair[0] + pair[1]) + (pair[2] + pair[3])) + (
            (pair[4] + pair[5]) + (pair[6] + pair[7])
        )
        avoided *= self.horizon / (GRID - 1) / 2
        k = expected  # the last point's: tokens the user expects by the horizon's end
        whole = k * float(self.expected_ttft_of[req]) + k * max(k - 1, 0.0) / (2 * speed)
        return avoided / whole if whole > 0 else 0.0

    def settled_value(self, start: float, client: int, now: float) -> float:
        """The value at `now` of a settled request whose user expects its first token at
        `start` (`phases`), in closed form: served over the horizon, it gains every token it
        serves (g / token_latency at each point g), so the delay area avoided is that line's,
        H^2 / (2 token_latency), and the value is that over the expected timeline's area. Equal
        to `values` up to float rounding: the waiting index bounds groups with it."""
        speed = float(self.reading_speed_of_client[client])
        k = max((now + self.horizon - start) * speed + 1.0, 0.0)
        whole = k * float(self.expected_ttft_of_client[client]) + k * max(k - 1, 0.0) / (2 * speed)
        avoided = self.horizon * self.horizon / (2 * self.token_latency)
        return avoided / whole if whole > 0 else 0.0

    def _blocks(self, rows: list[int]) -> np.ndarray:
        """KV blocks each request needs to run: its prompt, tokens so far and the next."""
        assert self.view is not None
        r = np.asarray(rows, dtype=np.int64)
        tokens = self.trace.prompt_len[r] + self.generated[r] + 1
        return -(-tokens // self.view.block_size)

    def phases(self, rows: list[int]) -> Phases:
        """When each waiting request's value stops being 0 (its user expects, within the
        horizon, more than it has), and when it settles (the user expects, from now and at the
        horizon's end, more than serving it could give: the delay area avoided is then the
        whole horizon's and the value only falls as the expected timeline grows)."""
        r = np.asarray(rows, dtype=np.int64)
        start, speed = self.first_expected[r], self.speed_of[r]
        have = self.generated[r].astype(np.float64)
        horizon, served = self.horizon, self.horizon / self.token_latency
        wakes = start - horizon + (have - 1) / speed - PHASE_MARGIN
        settles = start + np.maximum((have - 1) / speed, (have - 1 + served) / speed - horizon)
        return Phases(wakes, settles + PHASE_MARGIN, start, self.trace.client[r])

    def reschedule(self, running: list[int], queue: WaitingQueue, now: float) -> list[int]:
        """The running requests to preempt before this step (the knapsack's leftovers)."""
        if self.max_preempt == 0 or not self._pressed():
            return []
        # only requests under their preemption cap can be moved: the others are not valued
        cap = self.preemptions_per_request
        eligible = [r for r in running if self.preempted[r] < cap]
        if not eligible:
            return []
        run_values = self.waiting.value_running(eligible, queue, now)
        order = np.argsort(run_values, kind="stable")
        # a value of 0 is at most any waiting value: the best waiting value is needed only
        # when fewer than max_preempt of them are worth nothing
        zeros = int(np.count_nonzero(run_values == 0.0))
        best_waiting = 0.0 if zeros >= self.max_preempt else self.waiting.best_value(queue, now)
        movable = [eligible[i] for i in order if run_values[i] <= best_waiting][: self.max_preempt]
        if not movable:
            return []
        assert self.view is not None
        keep = [r for r in running if r not in movable]
        capacity = self.view.kv_blocks()[1] - (int(self._blocks(keep).sum()) if keep else 0)
        densities = [run_values[eligible.index(r)] for r in movable] / self._blocks(movable)
        taken = self._fill(movable, densities.tolist(), capacity, queue, now)
        victims = [r for r in movable if r not in taken]
        self.preempted[victims] += 1
        for victim in victims:
            self.waiting.entered(victim)
        return victims

    def _fill(
        self,
        movable: list[int],
        densities: list[float],
        capacity: int,
        queue: WaitingQueue,
        now: float,
    ) -> set[int]:
        """The knapsack: the movable and the waiting requests by value per KV block (ties:
        movable first, in their order, then queue order), each taken while it fits, until the
        blocks are 90% used (the reference solver stops there). Returns the movable taken;
        stops as soon as every movable one is decided. `densities`: the movable ones' values
        per KV block."""
        needs = self._blocks(movable).tolist()
        room = Room(capacity if capacity > 0 else None)
        first = list(zip(densities, movable, needs, strict=True))
        taken: set[int] = set()
        used = 0
        ranked = self.waiting.ranked(queue, now, room, first)
        try:
            # while under 90% full, the ranking passes over what does not fit (the reference
            # solver skips it); from there on, the first that does not fit ends the knapsack
            undecided = dict(zip(movable, needs, strict=True))
            for _, req in ranked:
                need = undecided.pop(req) if req in undecided else self.waiting.need(req)
                if used + need <= capacity:
                    used += need
                    taken.add(req)
                elif used >= 0.9 * capacity:
                    break
                if all(n > capacity - used for n in undecided.values()):
                    break  # the room only shrinks: none of the movable ones left can fit
                room.blocks = capacity - used if used < 0.9 * capacity else None
        finally:
            ranked.close()
        return taken & set(movable)

    def victim(self, running: list[int]) -> int:
        """vLLM's rule when a step runs out of blocks (the preempted request waits again)."""
        req = super().victim(running)
        self.waiting.entered(req)
        return req

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        """Below the threshold, arrival order; above it, the best value per KV block (ties in
        queue order; when every waiting value is 0, the oldest)."""
        if not len(queue):
            return None
        if not self._pressed():
            return queue.oldest()
        ranked = self.waiting.ranked(queue, now)
        try:
            best = next(ranked, None)
        finally:
            ranked.close()
        return queue.oldest() if best is None else best[1]

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        return Verdict.ADMIT if fits else Verdict.WAIT
