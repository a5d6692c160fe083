"""The runner's side of disaggregated pools (simulator/engines/disaggregation.py says the
journey): building the two pools, routing arrivals, the handoff after the first token, the timed
KV transfer, and the books each request keeps of it."""

from __future__ import annotations

import copy
import heapq
from dataclasses import replace
from typing import Protocol

import numpy as np
import simpy

from cost_models.base import StepCostModel
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.seam import CounterPolicy, Left, Policy, ReplicaAware, check_hooks
from simulator.engines.disaggregation import DisaggregationConfig, KVLink, with_settings
from simulator.engines.dispatch import ClusterConfig, Dispatcher, RoutingConfig, make_dispatcher
from simulator.engines.step_model import EngineConfig, Host, StepModel
from simulator.engines.vllm import VLLMConfig, VLLMReplica, VLLMRequests
from traces.schema import Trace


class Fleet(Host, Protocol):
    """The runner, as the pools see it: its replicas' host, with the replicas themselves."""

    replicas: list[StepModel]
    env: simpy.Environment
    cuts_runs: bool  # runs of decode steps go on past arrivals, cut where something reaches

    timeouts: np.ndarray | None  # per request, when its client gives up after sending it

    def watch_timeout(self, replica: int, req: int, now: float) -> bool:
        """`req` joins `replica`'s queue, which drops it when its client gives up; False: the
        client already has (the request ended)."""
        ...

    def accept(self, replica: int, req: int, now: float) -> None:
        """An arrival reaches `replica`: refused, rejected by its policy, or queued."""
        ...

    def cut(self, replica: int, t: float) -> None:
        """Something reaches `replica` at `t`: a run of decode steps under way there ends with
        the step under way then."""
        ...


class DisaggregatedPools:
    """Prefill replicas 0..P-1 and decode replicas P..P+D-1 of one run."""

    def __init__(
        self,
        runner: Fleet,
        cluster: ClusterConfig,
        policy: Policy,
        engine: EngineConfig,
        cost: StepCostModel,
    ) -> None:
        pd = cluster.disaggregation
        assert isinstance(pd, DisaggregationConfig)  # ClusterConfig parsed it
        if not isinstance(engine, VLLMConfig):
            raise ConfigError(
                f"cluster.prefill_replicas > 0 (disaggregated pools) needs engine=vllm, got "
                f"engine={engine.name}"
            )
        self.runner, self.pd = runner, pd
        self.P, self.D = cluster.prefill_replicas, cluster.decode_replicas
        # a KV connector joins the pools: vLLM then turns its hybrid KV cache manager off
        # unless told otherwise (`VLLMConfig.kv_layout`)
        self.configs = tuple(
            replace(c, hybrid_kv_cache_manager=False) if c.hybrid_kv_cache_manager is None else c
            for c in (
                with_settings(engine, pd.prefill_engine, "prefill_engine"),
                with_settings(engine, pd.decode_engine, "decode_engine"),
            )
        )
        self.costs = (
            with_settings(cost, pd.prefill_cost_model, "prefill_cost_model"),
            with_settings(cost, pd.decode_cost_model, "decode_cost_model"),
        )
        sizes = {
            pd.transfer_bytes_per_token(cfg.kv_layout(c))
            for cfg, c in zip(self.configs, self.costs, strict=True)
        }
        if len(sizes) > 1:
            raise ConfigError(
                "cluster.disaggregation: the two pools' cost models give different KV sizes "
                f"per token {sorted(sizes)}: both pools must serve the same model"
            )
        self.bytes_per_token = sizes.pop()
        client_of = runner.state.client_of
        routing = cluster.routing
        assert isinstance(routing, RoutingConfig)
        self.prefill_dispatcher = make_dispatcher(pd.prefill_dispatcher, self.P, client_of, routing)
        self.decode_dispatcher = make_dispatcher(pd.decode_dispatcher, self.D, client_of, routing)
        for dispatcher in (self.prefill_dispatcher, self.decode_dispatcher):
            dispatcher.see_trace(runner.trace)
        self.link = KVLink(pd.link_bandwidth_gbps, pd.link_latency, pd.shared_link)
        self.policies = self._policies(policy)
        n = len(runner.trace)
        self.decode_of = np.full(n, -1, dtype=np.int64)  # decode replica picked on arrival
        self.prefill_of = np.full(n, -1, dtype=np.int64)  # -1: not disaggregated
        self.transfer_start = np.full(n, np.nan)
        self.transfer_end = np.full(n, np.nan)
        self.transfer_bytes = np.zeros(n, dtype=np.int64)
        # ends of the transfers on their way to each replica (a heap per replica)
        self.arriving: list[list[float]] = [[] for _ in range(self.P + self.D)]
        # decode replicas may take runs of decode steps (fast-forward) when nothing but their
        # own work can reach them within one: their own policy (not shared counters) and no
        # chained calls (a finish elsewhere could release one at any instant)
        self.fast_forward = (
            engine.fast_forward and pd.counters == "per_pool" and not runner.trace.chained
        )

    def _policies(self, policy: Policy) -> list[Policy]:
        """One policy object per replica (per_pool), or one for all (shared counters)."""
        n = self.P + self.D
        if self.pd.counters == "per_pool":
            return [policy] + [copy.deepcopy(policy) for _ in range(n - 1)]
        if not isinstance(policy, CounterPolicy) or isinstance(policy, ReplicaAware):
            raise ConfigError(
                "cluster.disaggregation.counters=shared needs a policy with per-client counters "
                f"that does not read one replica's cache (vtc, lcf, drr, fairserve), got "
                f"policy {policy.name!r}; counters=per_pool runs any policy"
            )
        return [policy] * n

    def refusals(self, trace: Trace) -> list[str | None]:
        """Why a request can never be served: the decode pool's reasons (its final KV, its
        length), and a prompt whose KV (with the first token) a prefill replica cannot hold."""
        prefill, decode = self.configs
        reason: list[str | None] = decode.refusals(trace, self.costs[1]).tolist()
        blocks = prefill.peak_blocks(trace.prompt_len, 2, self.costs[0]).tolist()
        room = prefill.num_blocks(self.costs[0])
        return [
            "kv_pool_too_small" if why is None and need > room else why
            for why, need in zip(reason, blocks, strict=True)
        ]

    def build(self, queues: list[WaitingQueue]) -> list[StepModel]:
        """The prefill replicas, which hand every request off after its first token, then the
        decode replicas, sharing one per-request engine state."""
        shared = VLLMRequests(len(self.runner.trace))
        replicas: list[StepModel] = []
        for pool, hands_off in ((0, True), (1, False)):
            cfg, cost = self.configs[pool], self.costs[pool]
            first = 0 if pool == 0 else self.P
            for k in range(first, first + (self.P if pool == 0 else self.D)):
                policy = self.policies[k]
                check_hooks(policy, cfg.name, cfg.offered_hooks)
                ff = self.fast_forward and not hands_off
                rep = VLLMReplica(k, self.runner, shared, policy, queues[k], cost, cfg, ff)
                rep.hands_off = hands_off
                replicas.append(rep)
        return replicas

    # ---- the journey -----------------------------------------------------------------------
    def route(self, req: int, now: float) -> None:
        """An arrival: its decode replica, then the decider; disaggregated, a prefill replica."""
        runner, P = self.runner, self.P
        decode = runner.replicas[P:]
        j = self.decode_dispatcher.route(req, decode, now)
        self.decode_of[req] = P + j
        cached = 0
        if self.pd.decider == "cache_miss_above":
            rep = decode[j]
            assert isinstance(rep, VLLMReplica)
            cached = rep.cached_tokens_now(req)
        if self.pd.disaggregates(runner.state.prompt[req], cached):
            i = self.prefill_dispatcher.route(req, runner.replicas[:P], now)
            self.prefill_of[req] = i
            runner.state.replica[req] = i
            runner.accept(i, req, now)
        else:
            runner.state.replica[req] = P + j
            runner.accept(P + j, req, now)

    def dispatchers(self) -> list[tuple[Dispatcher, list[StepModel]]]:
        """Each pool's dispatcher with the replicas it routes to."""
        replicas = self.runner.replicas
        return [
            (self.prefill_dispatcher, replicas[: self.P]),
            (self.decode_dispatcher, replicas[self.P :]),
        ]

    def prefilled(self, replica: int, rows: list[int], now: float) -> None:
        """Prefill replica `replica` sampled these requests' first tokens: each joins its
        decode replica's queue (that replica's policy sees it arrive)."""
        runner = self.runner
        if self.prefill_dispatcher.tracks_load:
            for r in rows:
                self.prefill_dispatcher.released(r, replica)
        shared = self.pd.counters == "shared"
        prefill_policy = runner.replicas[replica].policy
        settles = not shared and Left in prefill_policy.charged
        for r in rows:
            if settles:  # the decode pool's own policy charges the output
                prefill_policy.charge(Left(r, now, 0))
            j = int(self.decode_of[r])
            rep = runner.replicas[j]
            assert isinstance(rep, VLLMReplica)
            # a pool's own policy sees the request arrive; one shared policy saw it already
            # (a lift now would raise a backlogged client's counter without service)
            rejection = None if shared else rep.policy.on_arrival(r, now, rep.queue)
            if rejection is not None:
                runner.reject(r, now, rejection)  # its blocks there are freed as it ends
                continue
            if runner.timeouts is not None and not runner.watch_timeout(j, r, now):
                continue  # its client has gone (its blocks there are freed as it ends)
            rep.req.remote.add(r)
            runner.state.reason[r] = "queued"
            rep.queue.push(r)
            runner.queued(j, now)

    def fetch(self, replica: int, req: int, tokens: int, now: float) -> None:
        """Decode replica `replica` admitted `req`: its `tokens` tokens of KV start to move."""
        nbytes = tokens * self.bytes_per_token
        end = self.link.transfer(nbytes, now)
        self.transfer_start[req], self.transfer_end[req] = now, end
        self.transfer_bytes[req] = nbytes
        heapq.heappush(self.arriving[replica], end)
        # an event whose callback takes the KV in: a SimPy process per transfer would cost
        # two more events and a generator (the P/D Azure run moves 19,366)
        env = self.runner.env
        env.timeout(max(0.0, end - env.now)).callbacks.append(
            lambda _: self._arrive(replica, req, end)
        )

    def next_kv_arrival(self, replica: int) -> float:
        """When the next transfer on its way to `replica` ends (inf: none is)."""
        waiting = self.arriving[replica]
        return waiting[0] if waiting else np.inf

    def _arrive(self, replica: int, req: int, end: float) -> None:
        runner = self.runner
        heapq.heappop(self.arriving[replica])  # transfers end in time order
        if runner.horizon is not None and end > runner.horizon:
            return  # in flight at the horizon
        self._free_source(req, end)
        rep = runner.replicas[replica]
        assert isinstance(rep, VLLMReplica)
        if runner.cuts_runs:  # its pool and running batch change now
            runner.cut(replica, end)
        rep.kv_arrived(req)
        runner.queued(replica, end)

    def _free_source(self, req: int, now: float) -> None:
        """The prefill replica frees `req`'s blocks, and wakes if it idles for want of them."""
        i = int(self.prefill_of[req])
        rep = self.runner.replicas[i]
        assert isinstance(rep, VLLMReplica)
        rep.release_parked(req)
        if rep.has_work():  # (with nothing to do, the blocks change nothing it decides)
            self.runner.queued(i, now)

    def released(self, req: int, now: float) -> None:
        """`req` ended: it no longer loads its replicas, and a prefill replica still holding
        its KV (a decode replica's policy dropped it while it waited) frees it."""
        i, j = int(self.prefill_of[req]), int(self.decode_of[req])
        source = self.runner.replicas[i] if i >= 0 else None
        if isinstance(source, VLLMReplica) and req in source.parked:
            self._free_source(req, now)
        if i >= 0 and self.prefill_dispatcher.tracks_load:
            self.prefill_dispatcher.released(req, i)
        if j >= 0 and self.decode_dispatcher.tracks_load:
            self.decode_dispatcher.released(req, j - self.P)

    # ---- the books -------------------------------------------------------------------------
    def request_columns(self) -> dict[str, np.ndarray]:
        return {
            "prefill_replica": self.prefill_of,
            "kv_transfer_start": self.transfer_start,
            "kv_transfer_end": self.transfer_end,
            "kv_transfer_bytes": self.transfer_bytes,
        }

    def info(self) -> dict[str, object]:
        moved = self.transfer_bytes[np.isfinite(self.transfer_start)]
        return {
            "dispatcher": (
                f"prefill {self.pd.prefill_dispatcher}, decode {self.pd.decode_dispatcher}"
            ),
            "prefill_replicas": self.P,
            "decode_replicas": self.D,
            "kv_transfers": int(moved.shape[0]),
            "kv_bytes_moved": int(moved.sum()),
        }
