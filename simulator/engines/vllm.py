"""The vLLM-v1-style engine as a step model: one replica of a cluster.

Each step has one token budget (`max_num_batched_tokens`) and a cap on running requests
(`max_num_seqs`). Running requests are served first, in order: each catches its computed tokens
up to its tokens (prompt + generated), so a decode takes one token and a prompt is cut into
chunks that fit the budget. KV memory is paged (simulator/engines/kv_blocks.py); when a running
request's blocks cannot be allocated the policy names a victim (FCFS: the tail of running), which
loses its KV (recompute), goes back to the head of the waiting queue and later re-prefills
prompt + generated tokens. Waiting requests are admitted, in the policy's order, only in a step
that preempted nothing, and only while their blocks fit (keeping `watermark` of the pool free
while anything runs); the first that does not fit stops admission. The engine never looks at
output lengths: a request simply finishes when its last token is sampled.

Requests that can never finish (their final KV exceeds the whole pool) are refused on arrival.

Service charged to policies: computed prompt tokens as their chunk is scheduled (a prefix-cache
hit is free; recomputation after a preemption only with `charge_recompute`), every output token
after the first when it is sampled.

A replica running alone may take many decode steps at once when nothing can change the batch
(fast-forward), with the same timeline as stepping one by one. Tokens are recorded as runs over
this replica's steps (a preemption, or a step that leaves a decoding request out, ends a run).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from cost_models.base import StepCostModel, mixed_step_time
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.requests import IN_FLIGHT
from simulator.core.seam import (
    ADMIT,
    OutputTokens,
    Policy,
    PromptTokens,
    ReplicaAware,
    Rescheduler,
)
from simulator.core.timeline import DECODE, MIXED, PREFILL, StepRecorder
from simulator.engines.disaggregation import KVLink
from simulator.engines.fast_forward import MAX_RUN_STEPS, run_length
from simulator.engines.jitter import step_jitter
from simulator.engines.kv_blocks import (
    BlockPool,
    ChunkedBlockPool,
    CPUTier,
    SlidingBlockPool,
    StateBlockPool,
    WindowedBlockPool,
    block_keys,
    kv_token_bytes,
    window_cap,
)
from simulator.engines.step_model import (
    Deadlines,
    EngineKnobs,
    Host,
    Pairs,
    Plan,
    StepModel,
    all_layers_window,
    check_integers,
    chunked_layers,
    clients_gone,
    decode_step_ends,
    next_deadline,
    settle,
    state_groups,
)
from traces.schema import Trace

# Runs up to this long are timed step by step in floats (stopping at the first cut), longer ones
# as numpy arrays: the scalar path saves 9.5% of the Azure benchmark's simulation instructions
# (cachegrind, against SHORT_RUN_STEPS = 0).
SHORT_RUN_STEPS = 24


@dataclass(frozen=True)
class VLLMConfig(EngineKnobs):
    """Knobs of one vLLM-style replica, with vLLM's names where vLLM has the knob. The KV pool:
    `pool_tokens`, or `num_gpu_blocks` blocks (vLLM's override), or sized as vLLM sizes it from
    `gpu_memory_utilization` and the cost model's GPU (weights, activation and CUDA-graph reserve:
    `kv_capacity_tokens`); with none of them, the cost model's default capacity. The knobs every
    engine has come from `EngineKnobs`."""

    pool_tokens: int | None = None
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    watermark: float = 0.0
    enable_prefix_caching: bool = True
    charge_recompute: bool = False
    enable_chunked_prefill: bool = True  # false: a prompt is computed in one step or waits
    max_model_len: int | None = None  # prompt + output tokens a request may have (vLLM: 400)
    num_gpu_blocks: int | None = None  # KV blocks per replica (vLLM's num_gpu_blocks_override)
    gpu_memory_utilization: float | None = None  # share of GPU memory vLLM may use
    cpu_kv_tokens: int = 0  # a CPU tier for KV blocks, in tokens (0: none)
    cpu_kv_gbps: float = 25.0  # CPU <-> GPU bandwidth (PCIe), GB/s
    preemption_mode: str = "recompute"  # or swap: to the CPU tier where it fits
    kv_bytes_per_token: int | None = None  # null: the cost model's model
    # vLLM's hybrid KV cache manager (windowed layers keep only their windows); null: on, but
    # off with a KV connector (a CPU tier, or disaggregated pools), as vLLM turns it off
    hybrid_kv_cache_manager: bool | None = None

    name = "vllm"
    offered_hooks = (ReplicaAware, Rescheduler)

    def __post_init__(self) -> None:
        check_integers(self, 1, "block_size", "max_num_batched_tokens", "max_num_seqs")
        check_integers(self, 0, "cpu_kv_tokens")
        if self.pool_tokens is not None and (
            int(self.pool_tokens) != self.pool_tokens or self.pool_tokens < self.block_size
        ):
            raise ConfigError(
                f"engine.pool_tokens must be null or an integer >= engine.block_size "
                f"({self.block_size}), got {self.pool_tokens!r}"
            )
        if not (0.0 <= self.watermark < 1.0):
            raise ConfigError(f"engine.watermark must be in [0, 1), got {self.watermark!r}")
        for key in ("max_model_len", "num_gpu_blocks", "kv_bytes_per_token"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or int(v) != v or v < 1):
                raise ConfigError(f"engine.{key} must be null or an integer >= 1, got {v!r}")
        sizes = [k for k in ("pool_tokens", "num_gpu_blocks", "gpu_memory_utilization")
                 if getattr(self, k) is not None]  # fmt: skip
        if len(sizes) > 1:
            raise ConfigError(f"engine.{' and engine.'.join(sizes)}: give one way to size the pool")
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise ConfigError(f"engine.gpu_memory_utilization must be in (0, 1], got {u!r}")
        hma = self.hybrid_kv_cache_manager
        if hma is not None and not isinstance(hma, bool):
            raise ConfigError(
                f"engine.hybrid_kv_cache_manager must be true, false or null, got {hma!r}"
            )
        self._check_cpu_tier()
        super().__post_init__()

    def _check_cpu_tier(self) -> None:
        bw = self.cpu_kv_gbps
        if isinstance(bw, bool) or not (math.isfinite(bw) and bw > 0):
            raise ConfigError(f"engine.cpu_kv_gbps must be a number > 0, got {bw!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ConfigError(
                f"engine.preemption_mode must be recompute or swap, got {self.preemption_mode!r}"
            )
        if self.preemption_mode == "swap" and not self.cpu_kv_tokens:
            raise ConfigError("engine.preemption_mode=swap needs a CPU tier: engine.cpu_kv_tokens")

    def bytes_per_token(self, cost: StepCostModel) -> int:
        """KV bytes of one token (all layers): the configured figure, else the cost model's."""
        return kv_token_bytes(
            self.kv_bytes_per_token, self.kv_layout(cost), "engine.kv_bytes_per_token"
        )

    def kv_layout(self, cost: StepCostModel) -> StepCostModel:
        """The cost model whose model lays the KV pool out: with the hybrid KV cache manager
        off (`hybrid_kv_cache_manager`; null: off with a CPU tier), every windowed layer
        keeps every token's KV, as a full-attention layer does (vLLM's
        --disable-hybrid-kv-cache-manager); attention is computed over the windows still."""
        hma = self.hybrid_kv_cache_manager
        if hma or (hma is None and not self.cpu_kv_tokens):
            return cost
        full = getattr(cost, "with_full_attention", None)
        return cost if full is None else full()

    def for_cost(self, cost: StepCostModel) -> VLLMConfig:
        """With vLLM's block size for the model: larger than `block_size` for a model with
        recurrent layers, so that a block's page holds a layer's state (the cost model's
        `kv_block_size`)."""
        size = getattr(cost, "kv_block_size", None)
        block_size = self.block_size if size is None else size(self.block_size)
        if block_size == self.block_size:
            return self
        return dataclasses.replace(self, block_size=block_size)

    @property
    def state_pages(self) -> int:
        """Pages a request of a model with recurrent layers holds in each state group: its
        state, and with prefix caching on the state at its last block boundary, as vLLM keeps
        them."""
        return 2 if self.enable_prefix_caching else 1

    def num_blocks(self, cost: StepCostModel) -> int:
        adapted = self.for_cost(cost)
        if adapted is not self:
            return adapted.num_blocks(cost)
        cost = self.kv_layout(cost)
        if self.pool_tokens is not None:
            return int(self.pool_tokens) // self.block_size
        if self.num_gpu_blocks is not None:
            return int(self.num_gpu_blocks)
        capacity = getattr(cost, "kv_capacity_tokens", None)
        if capacity is None:
            raise ConfigError(
                "engine.pool_tokens is null but the cost model "
                f"({type(cost).__name__}) cannot derive a KV capacity; set engine.pool_tokens "
                "or engine.num_gpu_blocks, or use cost_model=roofline / fitted / vidur_profile"
            )
        if self.gpu_memory_utilization is None:
            return int(capacity()) // self.block_size
        tokens = capacity(
            self.gpu_memory_utilization,
            batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
        )
        return int(tokens) // self.block_size

    def window(self, cost: StepCostModel) -> tuple[int, int] | None:
        """The model's sliding-window layers as the pool keeps them (the cost model's
        `kv_window`): (window tokens, window groups), or None."""
        window = getattr(self.kv_layout(cost), "kv_window", None)
        return None if window is None else window()

    def block_pool(
        self, cost: StepCostModel, cpu: CPUTier | None, computed: list[int]
    ) -> BlockPool:
        """One replica's pool; a hybrid model's keeps its sliding layers' windows too (or its
        recurrent layers' states), and a model whose every layer slides holds a window per
        request."""
        adapted = self.for_cost(cost)
        if adapted is not self:
            return adapted.block_pool(cost, cpu, computed)
        blocks, caching = self.num_blocks(cost), self.enable_prefix_caching
        groups = state_groups(self.kv_layout(cost))
        if groups is not None:
            if cpu is not None:
                raise ConfigError(
                    "engine.cpu_kv_tokens > 0 (a CPU tier) is not modelled for a model with "
                    "recurrent layers (vLLM keeps their state with its hybrid KV cache manager, "
                    "which a KV connector turns off)"
                )
            return StateBlockPool(blocks, self.block_size, groups, self.state_pages, computed)
        window, whole = self.window(cost), all_layers_window(self.kv_layout(cost))
        if window is None and whole is None:
            return BlockPool(blocks, self.block_size, caching, cpu)
        if cpu is not None:
            raise ConfigError(
                "engine.cpu_kv_tokens > 0 (a CPU tier) with engine.hybrid_kv_cache_manager=true "
                "is not modelled for a model with windowed layers (vLLM turns the manager off "
                "with a KV connector); set it to null or false"
            )
        if whole is not None:
            return SlidingBlockPool(blocks, self.block_size, caching, whole, computed)
        assert window is not None
        kind = ChunkedBlockPool if chunked_layers(cost) else WindowedBlockPool
        return kind(blocks, self.block_size, caching, *window, computed)

    def refusals(self, trace: Trace, cost: StepCostModel) -> np.ndarray:
        """Per request, why the engine can never run it (None: it can): "kv_pool_too_small" if
        its final KV (prompt + output - 1 tokens) needs more blocks than one replica's pool has,
        "exceeds_max_model_len", or without chunked prefill
        "prompt_exceeds_max_num_batched_tokens"."""
        reason = np.full(len(trace), None, dtype=object)
        if not self.enable_chunked_prefill:
            too_long = trace.prompt_len > self.max_num_batched_tokens
            reason[too_long] = "prompt_exceeds_max_num_batched_tokens"
        if self.max_model_len is not None:
            reason[trace.prompt_len + trace.output_len > self.max_model_len] = (
                "exceeds_max_model_len"
            )
        peak = self.peak_blocks(trace.prompt_len, trace.output_len, cost)
        reason[peak > self.num_blocks(cost)] = "kv_pool_too_small"
        return reason

    def peak_blocks(
        self, prompt: np.ndarray, output: np.ndarray | int, cost: StepCostModel
    ) -> np.ndarray:
        """Per request, the most blocks it may hold alone: its final KV (prompt + output - 1
        tokens) and, for a hybrid model, its windows when decoding and when computing its
        first prompt chunk and its last (every group holds the whole chunk); for a model whose
        every layer slides, its window alone, or its chunks'."""
        adapted = self.for_cost(cost)
        if adapted is not self:
            return adapted.peak_blocks(prompt, output, cost)
        b = self.block_size
        final = -(-(prompt + output - 1) // b)
        groups = state_groups(self.kv_layout(cost))
        if groups is not None:  # its state's pages in every group
            return final + groups * self.state_pages
        window, whole = self.window(cost), all_layers_window(self.kv_layout(cost))
        if window is None and whole is None:
            return final
        chunk = np.minimum(prompt, self.max_num_batched_tokens)
        if not self.enable_chunked_prefill:
            chunk = prompt
        prompt_blocks, chunk_blocks = -(-prompt // b), -(-chunk // b)
        if whole is not None:  # its window, decoding or computing its first chunk or its last
            cap = window_cap(whole, b)
            last = np.minimum(prompt_blocks, chunk_blocks + cap)
            return np.maximum(np.minimum(final, cap), np.maximum(chunk_blocks, last))
        assert window is not None
        tokens, groups = window
        cap = tokens // b if chunked_layers(cost) else window_cap(tokens, b)
        decoding = final + groups * np.minimum(final, cap)
        first = (1 + groups) * chunk_blocks
        last = prompt_blocks + groups * np.minimum(prompt_blocks, chunk_blocks + cap)
        return np.maximum(decoding, np.maximum(first, last))

    def for_lone_requests(self, prompt_tokens: int, cost: StepCostModel) -> VLLMConfig:
        """A copy in which a lone request of up to `prompt_tokens` prompt tokens and one output
        token always runs (no horizon): for profiling. Prompts are chunked as configured."""
        cfg = self.for_cost(cost)
        state = (state_groups(cost) or 0) * cfg.state_pages
        need = -(-(prompt_tokens + 1) // cfg.block_size) + state
        blocks = max(cfg.num_blocks(cost), need)
        return dataclasses.replace(cfg, pool_tokens=blocks * cfg.block_size, horizon=None)

    def replicas(self, host: Host, pairs: Pairs, cost: StepCostModel, ff: bool) -> list[StepModel]:
        shared = VLLMRequests(len(host.trace))  # per-request engine state all replicas fill
        return [
            VLLMReplica(i, host, shared, p, q, cost, self, ff) for i, (p, q) in enumerate(pairs)
        ]

    def info(self) -> dict[str, object]:
        return {"block_size": self.block_size}


class VLLMRequests:
    """Per-request engine state shared by the replicas (under a shared queue a preempted
    request may resume on another replica)."""

    def __init__(self, n: int) -> None:
        self.computed = [0] * n  # tokens whose KV the request holds (or is computing)
        self.high_water = [0] * n  # tokens ever computed or served from the cache
        # prompt tokens served from the prefix cache when first admitted (counted once)
        self.cached_tokens = [0] * n
        # tokens served from the cache when re-admitted after a preemption: recompute avoided
        self.recompute_avoided = [0] * n
        self.preemptions = [0] * n
        self.cpu_cached_tokens = [0] * n  # prompt tokens loaded from the CPU tier, first time
        # waiting request -> tokens of KV swapped out at a preemption, and the CPU tier (of the
        # replica that preempted it) holding them
        self.swapped: dict[int, tuple[int, CPUTier]] = {}
        self.swap_ins = [0] * n
        # disaggregated pools: waiting requests whose prompt KV is held on a prefill replica
        self.remote: set[int] = set()


@dataclass(slots=True)
class StepPlan(Plan):
    """One step: who computes how many tokens (`new`), of which kind, after how many
    preemptions."""

    rows: list[int]
    new: list[int]
    kind: int
    preempted: int


@dataclass(slots=True)
class DecodeRunPlan(Plan):
    """Fast-forward: every running request decodes one token in each of len(ends) steps."""

    rows: list[int]
    tokens: list[int]  # tokens each holds KV for before the run
    kv_used: list[int]  # KV tokens in use after each step (the blocks are taken when decided)
    evicted: list[int]  # the cached keys evicted for its blocks, in order (`cut_run`)


class VLLMReplica:
    """One vLLM-v1-style replica (the `StepModel` the runner hosts): each step serves the
    running requests first, in order (a decode takes one token, a prompt the chunk the token
    budget leaves), then admits waiting requests in the policy's order while their blocks fit;
    a request whose next block cannot be allocated makes the policy name a victim, which is
    preempted (recompute). Its paged memory and prefix cache are a `BlockPool`."""

    def __init__(
        self,
        index: int,
        host: Host,
        shared: VLLMRequests,
        policy: Policy,
        queue: WaitingQueue,
        cost: StepCostModel,
        cfg: VLLMConfig,
        fast_forward: bool,
    ) -> None:
        self.index, self.host, self.req = index, host, shared
        self.policy, self.queue = policy, queue
        self.cost, self.cfg, self.fast_forward = cost, cfg, fast_forward
        self.trace, self.state, self.feed = host.trace, host.state, host.feed(index)
        cpu = CPUTier(cfg.cpu_kv_tokens // cfg.block_size) if cfg.cpu_kv_tokens else None
        self.pool = cfg.block_pool(cost, cpu, shared.computed)
        # the CPU tier's link: loads (and swaps) move one at a time, in the order asked
        self.pcie = KVLink(cfg.cpu_kv_gbps, 0.0, shared=True)
        self.kv_bytes = cfg.bytes_per_token(cost) if cpu is not None else 0
        self.loading: list[tuple[float, int]] = []  # (when its KV is in, request): a heap
        self.bytes_loaded = self.bytes_swapped_out = 0
        self.swap_seconds = 0.0  # swap-out copies the next step waits for
        self.pool_tokens = self.pool.num_blocks * cfg.block_size
        self.watermark_blocks = int(cfg.watermark * self.pool.num_blocks)
        self._prompt, self._output = self.state.prompt, self.state.output
        self.charge_prompt = PromptTokens in policy.charged
        self.charge_output = OutputTokens in policy.charged
        if isinstance(policy, ReplicaAware):  # the policy reads this replica's cache and memory
            policy.see_replica(self)
        # a policy that preempts by its own choice (Andes) decides before every step
        self.reschedule = policy.reschedule if isinstance(policy, Rescheduler) else None
        if self.reschedule is not None:
            self.fast_forward = False
        self.running: list[int] = []
        self.now = 0.0
        self.steps = StepRecorder()
        # live mode (token_times): closed token runs of this replica by row, read incrementally
        self._closed_runs: dict[int, list[tuple[int, int, int]]] = {}
        self._runs_seen = 0
        self._aborting: list[int] = []  # live mode: running requests to drop at the next step
        # (when its client gives up, request) of requests that may be here: a heap
        self.deadlines: Deadlines = []
        self.jitter = step_jitter(cfg.step_jitter_cv, cfg.step_jitter_seed, index, cfg.run_speed_cv)
        self._keys: dict[int, list[int]] = {}
        self.prefilling: set[int] = set()  # running requests whose (re)prefill is not done
        self.stalled: set[int] = set()  # decoding requests a step left out (token run ended)
        # disaggregated pools (simulator/engines/disaggregation.py)
        self.hands_off = False  # a prefill replica: requests leave after their first token
        self.parked: set[int] = set()  # handed off, blocks held until their transfer ends
        self.receiving: set[int] = set()  # admitted, blocks held, their KV still on the link
        self.received: list[int] = []  # KV arrived: they join the running batch next step
        self.gave_up_in_transit: set[int] = set()  # clients left while the KV was on its way
        self.unrecorded_preemptions = 0  # made in a step that then had nothing to run
        self.runs_cut = False  # the runner cuts its runs where something reaches it (`cut_run`)

    # ---- what the runner asks ------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.running or len(self.queue) or self.received)

    def next_event(self) -> float:
        """When this replica next has something of its own to do with nothing arriving: the
        next load from its CPU tier ending, or the next client giving up on a request here
        (inf: neither)."""
        loaded = self.loading[0][0] if self.loading else math.inf
        return min(loaded, next_deadline(self.deadlines, self.state.status))

    def kv_used(self) -> int:
        return self.pool.used * self.cfg.block_size

    def schedule(self, frontier: float) -> Plan | None:
        if self._aborting:
            self._drop_aborted()
        while self.loading and self.loading[0][0] <= self.now:
            self._loaded(heapq.heappop(self.loading)[1])
        if self.received:
            self._join_received()
        if self.deadlines and self.deadlines[0][0] <= self.now:
            self._drop_timed_out(self.now)
        if self.fast_forward and self._can_run():
            plan = self._decode_run(frontier)
            if plan is not None:
                return plan
        return self._schedule() if self.has_work() else None

    def apply(self, plan: Plan) -> None:
        if type(plan) is DecodeRunPlan:
            self._apply_run(plan)
        else:
            assert isinstance(plan, StepPlan)
            self._apply_step(plan)

    def remaining_tokens(self, req: int) -> int:
        p = self._prompt[req]
        return p + self._output[req] - min(self.req.computed[req], p) - self.state.generated[req]

    def close(self) -> None:
        if self.cfg.horizon is not None:  # (a run of steps may have passed a deadline)
            self._drop_timed_out(self.cfg.horizon)
        self.pool.check()  # private + cached + empty blocks add up to the pool
        cpu, status = self.pool.cpu, self.state.status
        ended = [r for r in cpu.swapped if status[r] != IN_FLIGHT] if cpu is not None else []
        if ended:  # a request that left holds no KV in the CPU tier
            raise RuntimeError(f"CPU KV tier still holds requests that ended: {ended[:5]}")
        for r in self.running:
            self.state.reason[r] = "running"
        for r in [*self.receiving, *self.received]:
            self.state.reason[r] = "kv_transfer"
        for _, r in self.loading:
            self.state.reason[r] = "kv_load"

    def abort(self, req: int) -> None:
        self._aborting.append(req)

    def _drop_aborted(self) -> None:
        """Drop the aborted running requests and free their blocks before the next step."""
        for req in self._aborting:
            if req not in self.running:
                continue  # it finished meanwhile
            self._leave(req, self.running.index(req))
            self.host.aborted(self.index, req, self.now)
        self._aborting.clear()

    def watch_timeout(self, req: int, deadline: float) -> None:
        """`req` joins this replica's queue; its client gives up at `deadline`."""
        heapq.heappush(self.deadlines, (deadline, req))

    def _drop_timed_out(self, until: float) -> None:
        """As vLLM drops a request whose client disconnected, before its next step (`until`:
        now), or when the run stops at its horizon (`until`: the horizon): each request here
        whose client gave up by `until` leaves the queue or the running batch, ending at
        `until` (its blocks freed; the tokens it emitted stay emitted). One whose KV is still
        on its way (loading from the CPU tier, or moving from a prefill replica) is dropped
        once it has joined the batch."""
        queue = self.queue
        for req in clients_gone(self.deadlines, self.state.status, until):
            if req in queue:
                queue.remove(req)
                self.forget_waiting(req)
                self.host.timed_out(self.index, req, until)
            elif req in self.running:
                self._leave(req, self.running.index(req))
                self.host.timed_out(self.index, req, until)
            elif req in self.receiving or any(r == req for _, r in self.loading):
                self.gave_up_in_transit.add(req)  # dropped as it joins (`_join_received`)

    def token_times(self, req: int, start: int) -> list[float]:
        """Times of the tokens `req` has emitted so far, from index `start` on: each run of
        tokens takes one per step from the step it started in (a preemption or a skipped step
        starts a new run)."""
        emitted = self.state.generated[req]
        if emitted <= start:
            return []
        ends, tokens = self.steps.ends, self.host.tokens
        closed = tokens.closed_since(self._runs_seen)
        self._runs_seen += len(closed)
        for row, index, count, replica, tick in closed:
            if replica == self.index:
                self._closed_runs.setdefault(row, []).append((index, count, tick))
        runs = list(self._closed_runs.get(req, ()))
        now = tokens.open_run(req)
        if now is not None:
            runs.append((now[0], emitted - now[0], now[2]))
        times: list[float] = []
        for index, count, tick in runs:
            lo, hi = max(start, index), min(emitted, index + count)
            times.extend(ends[tick + lo - index : tick + hi - index])
        return times

    def token_clock(self, steps: dict[str, np.ndarray]) -> np.ndarray:
        return steps["end"]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.pool.cpu is not None:
            block = self.cfg.block_size * self.kv_bytes
            out["cpu_kv_bytes_offloaded"] = self.pool.cpu.stored * block
            out["cpu_kv_bytes_loaded"] = self.bytes_loaded
            out["cpu_kv_bytes_swapped_out"] = self.bytes_swapped_out
        # preemptions no step recorded: made with nothing left to run (the horizon came first,
        # or the clients of the requests left gave up)
        if self.unrecorded_preemptions:
            out["preemptions_not_in_steps"] = self.unrecorded_preemptions
        return out

    def request_columns(self) -> dict[str, np.ndarray]:
        return {
            "preemptions": np.asarray(self.req.preemptions, dtype=np.int64),
            "cached_tokens": np.asarray(self.req.cached_tokens, dtype=np.int64),
            "recompute_avoided_tokens": np.asarray(self.req.recompute_avoided, dtype=np.int64),
            **(
                {
                    "cpu_cached_tokens": np.asarray(self.req.cpu_cached_tokens, dtype=np.int64),
                    "swap_ins": np.asarray(self.req.swap_ins, dtype=np.int64),
                }
                if self.cfg.cpu_kv_tokens
                else {}
            ),
        }

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    def kv_blocks(self) -> tuple[int, int]:
        """(blocks in use, blocks in the pool) (`ReplicaView`)."""
        return self.pool.used, self.pool.num_blocks

    def cached_tokens(self, req: int) -> int:
        """The prompt tokens of waiting request `req` this replica's cache holds now
        (`ReplicaView`): tracked by the pool while it waits."""
        total = self._prompt[req] + self.state.generated[req]  # a resumed request: all of it
        return self.pool.tracked_prefix(req, self.keys(req), total) * self.cfg.block_size

    def match_version(self) -> int:
        """Changes whenever `cached_tokens` of a request it was asked about changes
        (`ReplicaView`)."""
        return self.pool.match_version

    def cached_tokens_now(self, req: int) -> int:
        """The prompt tokens of `req` this replica's cache holds now, looked up once (a
        dispatcher routing an arrival: not tracked)."""
        total = self._prompt[req] + self.state.generated[req]
        return self.pool.cached_prefix(self.keys(req), total) * self.cfg.block_size

    def keys(self, req: int) -> list[int]:
        if not self.pool.caching or self.trace.block_hashes is None:
            return []
        keys = self._keys.get(req)
        if keys is None:
            keys = block_keys(
                self.trace.block_hashes[req],
                self.trace.hash_block_tokens,
                self.cfg.block_size,
                self._prompt[req],
            )
            self._keys[req] = keys
        return keys

    # ---- deciding a step -----------------------------------------------------------------
    def _schedule(self, carried: int = 0) -> StepPlan | None:
        """Decide one step. `carried`: preemptions of an empty step just before (the victim
        was the request being scheduled and came first), recorded with this one."""
        cfg, pool = self.cfg, self.pool
        prompt, computed, gen = self._prompt, self.req.computed, self.state.generated
        prefilling = self.prefilling
        budget = cfg.max_num_batched_tokens
        running = self.running
        rows: list[int] = []
        new: list[int] = []
        preempted = 0
        chosen = 0  # preemptions the policy chose (admission still follows them)
        if self.reschedule is not None and running and len(self.queue):
            for victim in self.reschedule(list(running), self.queue, self.now):
                self._preempt(victim, running.index(victim))
                chosen += 1
        i = 0
        n_run = len(running)
        known = 0  # leading rows known to be plain decodes
        # the common case: every running request decodes one token; if the pool has the new
        # blocks those whose last block is full need, nothing is preempted
        plain = n_run and n_run <= budget and not prefilling and not self.stalled
        if plain and pool.add_token_each(running, computed):
            rows, new, i = list(running), [1] * n_run, n_run
            budget -= n_run
            known = n_run
        held, size = pool.held, cfg.block_size
        while i < len(running) and budget > 0:
            r = running[i]
            if r in prefilling:  # a prompt takes the chunk the budget leaves
                n = min(prompt[r] + gen[r] - computed[r], budget)
                fits = pool.grow(r, computed[r] + n)
            else:  # a decode takes one token, and a new block only when its last one is full
                n = 1
                fits = computed[r] < held[r] * size or pool.grow(r, computed[r] + 1)
            if not fits:
                i, budget, dropped = self._make_room(r, n, i, rows, new, budget)
                preempted += dropped
                if r not in running:
                    break
            rows.append(r)
            new.append(n)
            budget -= n
            i += 1
        if not preempted:
            budget = self._admit(rows, new, budget)
        if not rows:
            if preempted and running:  # an empty step: decide again, with fewer running
                return self._schedule(carried + preempted + chosen)
            # nothing runs now (the lone request made room for itself while blocks are held
            # for KV on its way): its preemption is recorded with the next step
            self.unrecorded_preemptions += carried + preempted + chosen
            return None
        preempted += self.unrecorded_preemptions
        self.unrecorded_preemptions = 0
        return self._timed(rows, new, preempted + chosen + carried, known)

    def _make_room(
        self, r: int, n: int, i: int, rows: list[int], new: list[int], budget: int
    ) -> tuple[int, int, int]:
        """Preempt the policy's victims until `r` (the i-th running request) gets blocks for
        `n` more tokens or is itself the victim. Returns (i, budget, preemptions)."""
        running, count = self.running, 0
        while True:
            victim = self.policy.victim(running)
            v = running.index(victim)
            if v < i:  # already scheduled this step: give its tokens back
                rows.pop(v)
                budget += new.pop(v)
                i -= 1
            self._preempt(victim, v)
            count += 1
            if victim == r or self.pool.grow(r, self.req.computed[r] + n):
                return i, budget, count

    def _admit(self, rows: list[int], new: list[int], budget: int) -> int:
        """Admit waiting requests in the policy's order into this step (`rows`, with their
        `new` tokens) while the running cap, the token `budget` and their KV blocks allow;
        the budget left."""
        cfg, pool, state, policy, queue = self.cfg, self.pool, self.state, self.policy, self.queue
        running, now = self.running, self.now
        # requests whose KV is on its way will run too
        cap = cfg.max_num_seqs - self._in_transit()
        while len(queue) and budget > 0 and len(running) < cap:
            req = policy.pick(queue, now)
            if req is None:
                break
            if req in self.req.remote:
                if not self._admit_remote(req):
                    break
                cap = cfg.max_num_seqs - self._in_transit()
                continue
            total = self._prompt[req] + state.generated[req]  # a resumed request recomputes all
            keys = self.keys(req)
            held = self.req.swapped.get(req)
            if held is not None and held[1] is not pool.cpu:  # (a queue shared by replicas)
                self._forget_swap(req)  # swapped out on another replica: recomputed here
                held = None
            swapped = None if held is None else held[0]
            hit = 0 if swapped is not None else pool.cached_prefix(keys, total)
            from_cpu = 0 if swapped is not None else pool.cpu_prefix(keys, hit, total)
            if swapped is not None or from_cpu:  # KV comes back from the CPU tier first
                tokens = swapped if swapped is not None else (hit + from_cpu) * cfg.block_size
                if not self._admit_loaded(req, keys, hit, tokens):
                    break
                cap = cfg.max_num_seqs - self._in_transit()
                continue
            start = hit * cfg.block_size
            if not cfg.enable_chunked_prefill and total - start > budget:
                break  # the whole prompt in one step, or not yet
            n = min(total - start, budget)
            reserve = self.watermark_blocks if running else 0
            fits = pool.fits(keys, hit, start + n, reserve)
            verdict = policy.admit(req, now, fits)
            if verdict is not ADMIT or not fits:
                if settle(policy, queue, self.host, req, now, fits, verdict):
                    self.forget_waiting(req)  # it left the queue
                    continue
                break
            pool.admit(req, keys, hit, start + n, reserve)
            queue.remove(req)
            self.req.computed[req] = start
            first = state.admitted_at[req] != state.admitted_at[req]  # NaN: never admitted
            if first:
                self.req.cached_tokens[req] = start
            else:
                self.req.recompute_avoided[req] += start
            self.req.high_water[req] = max(self.req.high_water[req], start)
            state.reason[req] = "running"
            state.replica[req] = self.index
            running.append(req)
            self.prefilling.add(req)
            rows.append(req)
            new.append(n)
            budget -= n
            if first:
                state.admitted_at[req] = now
        return budget

    # ---- KV that arrives: from a CPU tier, or (disaggregated pools) a prefill replica -------
    def _in_transit(self) -> int:
        """Admitted requests not running yet: their KV is on its way."""
        return len(self.receiving) + len(self.received) + len(self.loading)

    def _admit_loaded(self, req: int, keys: list[int], hit: int, tokens: int) -> bool:
        """Admit `req` with blocks for its first `tokens` tokens, the first `hit` blocks GPU
        cache hits and the rest loaded from the CPU tier (prefix blocks it holds, or the
        request's own KV swapped out at a preemption); it runs once they are in. False: batch
        forming ends."""
        claimed = self._claim(req, keys, hit, tokens)
        if claimed is not True:
            return claimed is None  # dropped: pick again
        now, size = self.now, self.block_size
        state, r = self.state, self.req
        r.computed[req] = tokens
        if req in r.swapped:
            r.swapped.pop(req)[1].release_swap(req)  # (this replica's tier: `_admit`)
            r.swap_ins[req] += 1
            r.recompute_avoided[req] += tokens
        elif state.admitted_at[req] != state.admitted_at[req]:  # NaN: its first admission
            r.cached_tokens[req] = hit * size
            r.cpu_cached_tokens[req] = tokens - hit * size
        else:
            r.recompute_avoided[req] += tokens
        r.high_water[req] = max(r.high_water[req], tokens)
        if state.admitted_at[req] != state.admitted_at[req]:
            state.admitted_at[req] = now
        state.reason[req] = "kv_load"
        state.replica[req] = self.index
        moved = (tokens - hit * size) * self.kv_bytes
        self.bytes_loaded += moved
        heapq.heappush(self.loading, (self.pcie.transfer(moved, now), req))
        return True

    def _claim(self, req: int, keys: list[int], hit: int, tokens: int) -> bool | None:
        """Ask the policy to admit waiting `req` with blocks for its first `tokens` tokens (the
        first `hit` blocks cache hits) and take them from the pool: True if admitted (it has
        left the queue), None if the policy dropped it (pick again), False if batch forming
        ends."""
        pool, policy, queue, now = self.pool, self.policy, self.queue, self.now
        reserve = self.watermark_blocks if self.running else 0
        fits = pool.fits(keys, hit, tokens, reserve, computed=tokens)
        verdict = policy.admit(req, now, fits)
        if verdict is ADMIT and fits:
            pool.admit(req, keys, hit, tokens, reserve, computed=tokens)
            queue.remove(req)
            self.req.remote.discard(req)
            return True
        if settle(policy, queue, self.host, req, now, fits, verdict):
            self.forget_waiting(req)
            return None
        return False

    def forget_waiting(self, req: int) -> None:
        """A waiting request left for good (dropped): the pool stops tracking its prefix match
        and the KV it had swapped out to the CPU tier is no longer needed."""
        self.pool.untrack(req)
        self.req.remote.discard(req)
        self._forget_swap(req)

    def _loaded(self, req: int) -> None:
        """A load from the CPU tier ended: the prompt blocks it brought enter the GPU cache."""
        self.pool.register(req, self.keys(req), self.req.computed[req])
        self.received.append(req)

    def _forget_swap(self, req: int) -> None:
        """A waiting request left: the KV it had swapped out is no longer needed."""
        held = self.req.swapped.pop(req, None)
        if held is not None:
            held[1].release_swap(req)

    # ---- disaggregated pools ------------------------------------------------------------
    def _admit_remote(self, req: int) -> bool:
        """Admit waiting `req`, whose prompt KV a prefill replica holds, as vLLM's decode side
        does: blocks for its prompt (those this prefix cache holds are not moved), then the
        transfer of the rest; it decodes once the KV has arrived. False: batch forming ends."""
        prompt = self._prompt[req]
        keys = self.keys(req)
        hit = self.pool.cached_prefix(keys, prompt)
        claimed = self._claim(req, keys, hit, prompt)
        if claimed is not True:
            return claimed is None  # dropped: pick again
        now = self.now
        self.req.computed[req] = prompt
        self.req.high_water[req] = max(self.req.high_water[req], prompt)
        self.state.reason[req] = "kv_transfer"
        self.state.replica[req] = self.index
        self.receiving.add(req)
        self.host.fetch_kv(self.index, req, self.pool.moved_tokens(req, prompt, hit), now)
        return True

    def kv_arrived(self, req: int) -> None:
        """The transfer of `req`'s KV ended: its prompt blocks enter this prefix cache and it
        joins the running batch at the next step (which drops it at once if its client gave
        up meanwhile)."""
        self.receiving.discard(req)
        self.pool.register(req, self.keys(req), self._prompt[req])
        self.received.append(req)

    def _join_received(self) -> None:
        """Requests whose KV has arrived join the running batch: to decode, their next token
        sampled in this replica's next step (their token run here opens with it: nothing
        else keeps the batch from a run of decode steps), or to go on computing their
        prompt."""
        computed, gen, tokens = self.req.computed, self.state.generated, self.host.tokens
        for r in self.received:
            if r in self.gave_up_in_transit:  # its client left while its KV moved: drop it now
                self.gave_up_in_transit.discard(r)
                heapq.heappush(self.deadlines, (self.now, r))
            self.running.append(r)
            if gen[r] and computed[r] >= self._prompt[r] + gen[r] - 1:
                tokens.open(r, gen[r], self.index, len(self.steps))
            else:
                self.prefilling.add(r)
            self.state.reason[r] = "running"
        self.received.clear()

    def _hand_off(self, rows: list[int]) -> None:
        """Prefill replica: these requests sampled their first token; they leave the running
        batch for a decode replica, their blocks held until the transfer ends."""
        for r in rows:
            self.running.remove(r)
            self.host.tokens.close(r, self.state.generated[r])
            self.parked.add(r)
        self.host.prefilled(self.index, rows, self.now)

    def release_parked(self, req: int) -> None:
        """`req`'s KV has reached its decode replica: free its blocks here (full prompt blocks
        stay cached)."""
        self.parked.discard(req)
        self.pool.release(req)

    def _leave(self, req: int, position: int) -> None:
        """`req`, at `position` of the running list, leaves it (finished, preempted or
        aborted): its blocks go back to the pool (full prefix blocks stay cached) and its open
        token run ends."""
        self.running.pop(position)
        self.prefilling.discard(req)
        self.stalled.discard(req)
        self.pool.release(req)
        self.host.tokens.close(req, self.state.generated[req])

    def _preempt(self, req: int, position: int) -> None:
        r = self.req
        r.high_water[req] = max(r.high_water[req], r.computed[req])
        tokens, cpu = r.computed[req], self.pool.cpu
        swap = self.cfg.preemption_mode == "swap" and tokens > 0
        if swap and cpu is not None and cpu.swap_out(req, self.pool.blocks_for(tokens)):
            r.swapped[req] = (tokens, cpu)  # (no room there: recompute)
            self.bytes_swapped_out += tokens * self.kv_bytes
            # the copy out happens before the next step runs (vLLM's swap_out)
            self.swap_seconds += tokens * self.kv_bytes / self.pcie.bytes_per_second
        self._leave(req, position)
        r.computed[req] = 0
        r.preemptions[req] += 1
        self.state.reason[req] = "preempted"
        self.queue.push_front(req)
        self.host.queued(self.index, self.now)

    def _timed(self, rows: list[int], new: list[int], preempted: int, known: int = 0) -> StepPlan:
        """Charge the scheduled prompt chunks and time the step (the first `known` rows are
        plain decodes)."""
        policy, now, prefilling = self.policy, self.now, self.prefilling
        prompt, computed, hw = self._prompt, self.req.computed, self.req.high_water
        chunks: list[tuple[int, int]] = []
        decodes = known
        context = sum([computed[r] for r in rows[:known]]) + known
        for r, n in zip(rows[known:], new[known:], strict=True):
            c = computed[r]
            if r not in prefilling:
                decodes += 1
                context += c + 1
                continue
            chunks.append((n, c))
            fresh = max(0, min(c + n, prompt[r]) - max(c, hw[r]))
            again = max(0, min(c + n, hw[r]) - c)
            charged = fresh + (again if self.cfg.charge_recompute else 0)
            if charged and self.charge_prompt:
                policy.charge(PromptTokens(r, charged, now))
            hw[r] = max(hw[r], c + n)
        if chunks:
            kind = MIXED if decodes else PREFILL
            dt = mixed_step_time(self.cost, chunks, decodes, context)
        else:
            kind = DECODE
            dt = self.cost.decode_time(decodes, context)
        if self.jitter is not None:
            dt *= self.jitter.factor(len(self.steps))
        if self.swap_seconds:
            dt += self.swap_seconds
            self.swap_seconds = 0.0
        return StepPlan(now, [now + dt], now + dt, rows, new, kind, preempted)

    # ---- fast-forward ---------------------------------------------------------------------
    def _can_run(self) -> bool:
        """Whether the next step is plain decoding of the whole running set with nothing to
        admit (then several steps can be taken at once)."""
        cfg, n = self.cfg, len(self.running)
        if not n or self.prefilling or self.stalled or n > cfg.max_num_batched_tokens:
            return False
        return not len(self.queue) or n >= cfg.max_num_seqs

    def _decode_run(self, frontier: float) -> DecodeRunPlan | None:
        """As many decode steps as nothing can change: bounded by the next finish, the free
        blocks and MAX_RUN_STEPS, then cut by `run_length`. None: not even one step fits the
        free blocks (the general step preempts)."""
        cfg = self.cfg
        rows = list(self.running)
        n = len(rows)
        computed, gen, out = self.req.computed, self.state.generated, self._output
        tokens = [computed[r] for r in rows]
        until_finish = MAX_RUN_STEPS
        for r in rows:
            left = out[r] - gen[r]
            if left < until_finish:
                until_finish = left
        k = self.pool.decode_steps_that_fit(rows, tokens, until_finish)
        if not k:
            return None
        # an arrival it could admit ends the run, unless the runner cuts runs where one comes
        nxt = np.inf if n >= cfg.max_num_seqs or self.runs_cut else self.feed.next_time()
        nxt = min(nxt, self.next_event())  # a load from the CPU tier joins at the next step
        horizon = np.inf if cfg.horizon is None else cfg.horizon
        ends = self._decode_ends(n, n + sum(tokens), k, min(nxt, horizon, frontier))
        k = run_length(ends, next_arrival=nxt, horizon=cfg.horizon, frontier=frontier)
        if not self.runs_cut:
            # a request the run takes in whose client gives up meanwhile ends it with the step
            # under way then (stepping drops it before the next step; a cut run sees it come)
            gone = self.host.first_give_up(self.index, float(ends[k - 1]))
            k = min(k, bisect_left(ends, gone) + 1)
        # the run's blocks are taken now, as a step takes its blocks when it is decided: what
        # reads this pool during a run's last step (a decider, a dispatcher) sees what it would
        # see stepping one by one
        kv, evicted = self.pool.decode(rows, tokens, k)
        return DecodeRunPlan(self.now, ends[:k], float(ends[k - 1]), rows, tokens, kv, evicted)

    @property
    def runs_may_be_cut(self) -> bool:
        """`cut_run` can give a run's blocks back: no CPU tier (keys evicted there stay)."""
        return self.pool.cpu is None

    def cut_run(self, plan: Plan, t: float) -> Plan:
        """Something reaches this replica at `t` during `plan` (the runner's, when runs may go
        past arrivals): of a run of decode steps, the steps that end before `t` take effect
        now and only the one under way at `t` is left, its end the plan's; as if the run had
        been decided up to `t`. Returns what is left (`plan` itself when nothing changes)."""
        if type(plan) is not DecodeRunPlan:
            return plan
        ends, k = plan.ends, len(plan.ends)
        done = bisect_left(ends, t)  # due before t (an arrival comes before a step's end)
        if done == 0 and k == 1:
            return plan
        kept = min(k, done + 1)
        rows, tokens = plan.rows, plan.tokens
        if kept < k:
            self.pool.shorten(rows, tokens, k, kept, plan.evicted)
        start = plan.start
        if done:  # (no request finishes before a run's last step)
            self._apply_run(
                DecodeRunPlan(start, ends[:done], float(ends[done - 1]), rows, tokens,
                              plan.kv_used[:done], [])
            )  # fmt: skip
            start = self.now
        return DecodeRunPlan(
            start, ends[done:kept], float(ends[kept - 1]), rows, [n + done for n in tokens],
            plan.kv_used[done:kept], [],
        )  # fmt: skip

    def _decode_ends(self, n: int, context: int, k: int, cut: float) -> np.ndarray:
        """End times of up to k decode steps of n requests from now (context: the tokens the
        first attends to, n more each step); short runs stop timing steps once one ends at or
        after `cut` (nothing later can be taken)."""
        ends = decode_step_ends(
            self.cost, self.jitter, len(self.steps), self.now, n, context, k, SHORT_RUN_STEPS, cut
        )
        return np.array(ends) if isinstance(ends, list) else ends

    def _apply_run(self, plan: DecodeRunPlan) -> None:
        rows, ends = plan.rows, plan.ends
        assert isinstance(ends, np.ndarray)
        n, k, last = len(rows), ends.shape[0], plan.end
        state, feed, horizon = self.state, self.feed, self.cfg.horizon
        if self.charge_output:
            rows_arr = np.asarray(rows, dtype=np.int64)
            clients = state.client[rows_arr]
            done = 0
            limit = last if horizon is None else min(last, horizon)  # none arrive after it
            while feed.next_time() <= limit:  # arrivals see the charges before them
                t = feed.next_time()
                j = int(np.searchsorted(ends, t, side="left"))
                if j > done:
                    self.policy.charge(OutputTokens(rows_arr, clients, ends[done:j]))
                    done = j
                feed.ingest(t)
            self.policy.charge(OutputTokens(rows_arr, clients, ends[done:]))
        else:
            feed.ingest(last)
        computed, gen, out = self.req.computed, state.generated, self._output
        kv = plan.kv_used
        finished = []
        for r in rows:
            computed[r] += k
            g = gen[r] + k
            gen[r] = g
            if g == out[r]:
                finished.append(r)
        self._record(plan.start, ends, kv, DECODE, n, n, 0)
        self.now = last
        self._finish(finished)

    # ---- applying a step -----------------------------------------------------------------
    def _apply_step(self, plan: StepPlan) -> None:
        """The effects of one step at its end: arrivals up to then, prompt chunks computed
        (full prompt blocks registered in the cache), a token for each request that sampled
        one, the output charge, the step's record, and the requests that finished."""
        self.feed.ingest(plan.end)
        state, pool, prefilling, tokens = self.state, self.pool, self.prefilling, self.host.tokens
        prompt, out, computed, gen = self._prompt, self._output, self.req.computed, state.generated
        end, tick = plan.end, len(self.steps)
        emitted: list[int] = []
        finished: list[int] = []
        handed: list[int] = []
        stalled, hands_off = self.stalled, self.hands_off
        for r, n in zip(plan.rows, plan.new, strict=True):
            c = computed[r] + n
            computed[r] = c
            if r in prefilling:
                if c - n < prompt[r]:  # prompt positions computed: their full blocks are cached
                    pool.register(r, self.keys(r), c)
                if c < prompt[r] + gen[r]:
                    continue  # more chunks to come
                prefilling.discard(r)  # a token is sampled: the first, or the first after
                tokens.open(r, gen[r], self.index, tick)  # a preemption
                pool.prefill_done(r)
                if gen[r] == 0:
                    state.first_token_at[r] = end
                else:
                    emitted.append(r)
            else:
                if stalled and r in stalled:  # skipped in an earlier step: a new token run
                    stalled.discard(r)
                    tokens.open(r, gen[r], self.index, tick)
                emitted.append(r)
            g = gen[r] + 1
            gen[r] = g
            if g == out[r]:
                finished.append(r)
            elif hands_off and g == 1:
                handed.append(r)
        if len(plan.rows) < len(self.running):  # budget or a preemption stopped the loop:
            scheduled = set(plan.rows)  # decoders left out produce no token this step
            for r in self.running:
                if r not in scheduled and r not in prefilling and r not in stalled:
                    stalled.add(r)
                    tokens.close(r, gen[r])
        if emitted and self.charge_output:
            rows = np.asarray(emitted, dtype=np.int64)
            self.policy.charge(OutputTokens(rows, state.client[rows], np.array([end])))
        self._record(
            plan.start,
            [end],
            [self.kv_used()],
            plan.kind,
            len(plan.rows),
            sum(plan.new),
            plan.preempted,
        )
        self.now = end
        self._finish(finished)
        if handed:
            self._hand_off(handed)

    def _record(
        self,
        start: float,
        ends: list[float] | np.ndarray,
        kv: list[int],
        kind: int,
        batch: int,
        tokens: int,
        preempted: int,
    ) -> None:
        if kv[-1] > self.pool_tokens:  # KV only grows within a record
            raise RuntimeError(f"KV pool over-committed: {kv[-1]} > {self.pool_tokens}")
        self.steps.record(start, ends, kv, kind, batch, tokens, preempted)

    def _finish(self, finished: list[int]) -> None:
        if not finished:
            return
        for r in finished:
            self._leave(r, self.running.index(r))
        self.host.finish(self.index, finished, self.now)
