"""Paged KV memory for the vLLM-style engine: fixed-size blocks, optional prefix cache.

A request holds ceil(tokens / block_size) blocks for the tokens whose KV it has (or is about to)
compute. With prefix caching, full prompt blocks are keyed by content (the trace's block hash ids,
see `block_keys`); a finished or preempted request's keyed blocks stay cached, unreferenced, until
an allocation needs room and evicts the least recently freed. A new request reuses the longest
cached run of its leading keys, capped at prompt - 1 tokens (the last prompt token must be
computed to sample the first output token). A cached block shared by several running requests
counts once.

`free` is the number of blocks an allocation may take: empty ones plus unreferenced cached ones.
The pool never hands out more than it has; `check` verifies the counts.

With a CPU tier (`CPUTier`), a cached block evicted from the GPU is stored in CPU memory
(least recently stored dropped first when it is full), where a later request may find it and
load it back instead of recomputing; a preempted request's KV may be swapped there whole.

A hybrid model's sliding-window layers (gpt-oss, Gemma 3) take blocks of their own in the same
pool, a window's worth per request and group (`WindowedBlockPool`); a model whose every layer
slides (Mistral 7B v0.1, Phi-3 4k) holds a window's worth per request (`SlidingBlockPool`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from itertools import accumulate

import numpy as np

from simulator.core.errors import ConfigError


def kv_token_bytes(configured: int | None, cost: object, key: str) -> int:
    """KV bytes of one token, all layers: `configured` (the setting named `key`), else the
    cost model's model (2 x layers x KV heads x head size x dtype bytes)."""
    if configured is not None:
        return int(configured)
    spec = getattr(cost, "model_spec", None)
    if spec is None:
        raise ConfigError(
            f"{key} is null and the cost model ({type(cost).__name__}) does not know its "
            "model's KV size; set it (bytes per token: 2 x layers x kv_heads x head_dim x dtype "
            "bytes) or use cost_model=roofline / fitted"
        )
    return int(spec.kv_bytes_per_token)


def block_keys(hashes: np.ndarray, hash_block: int, block_size: int, tokens: int) -> list[int]:
    """Content keys of the full `block_size`-token blocks of a `tokens`-token prompt whose trace
    hash ids each cover `hash_block` tokens (Mooncake 512, the agentic sessions 64). Engine block j
    ends at token e = (j + 1) * block_size - 1, inside trace block e // hash_block; its content is
    fixed by that trace block's id (ids are prefix-chained) and the offset of e in it. Blocks past
    the listed ids have no key (they are never shared)."""
    ids = hashes.tolist()
    # blocks whose last token is inside the prompt and inside a listed trace block
    count = min(tokens // block_size, len(ids) * hash_block // block_size)
    ends = range(block_size - 1, count * block_size, block_size)
    return [int(ids[end // hash_block]) * hash_block + end % hash_block for end in ends]


class CPUTier:
    """KV blocks in CPU memory: prefix blocks evicted from the GPU, by key, least recently
    stored or used first out; and whole requests swapped out on preemption, which stay until
    they are swapped back in (or leave) and are never dropped for a prefix block."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.keys: OrderedDict[int, None] = OrderedDict()  # prefix blocks, oldest first
        self.swapped: dict[int, int] = {}  # request -> blocks it holds here
        self.swap_used = 0
        self.stored = 0  # prefix blocks stored (offloaded) over the run

    def store(self, key: int) -> None:
        """A cached block left the GPU: keep its KV here if there is room for prefix blocks."""
        if key in self.keys:
            self.keys.move_to_end(key)
            return
        if self.swap_used >= self.num_blocks:
            return
        if len(self.keys) + self.swap_used >= self.num_blocks:
            self.keys.popitem(last=False)
        self.keys[key] = None
        self.stored += 1

    def run(self, keys: list[int]) -> int:
        """How many of `keys`, from the first, are here (they become the most recently used)."""
        n = 0
        for key in keys:
            if key not in self.keys:
                break
            self.keys.move_to_end(key)
            n += 1
        return n

    def swap_out(self, req: int, blocks: int) -> bool:
        """Hold `req`'s `blocks` blocks, dropping prefix blocks for room; False if they cannot
        fit beside the requests already swapped out."""
        if self.swap_used + blocks > self.num_blocks:
            return False
        while self.keys and len(self.keys) + self.swap_used + blocks > self.num_blocks:
            self.keys.popitem(last=False)
        self.swapped[req] = blocks
        self.swap_used += blocks
        return True

    def release_swap(self, req: int) -> None:
        """`req`'s swapped KV is no longer needed (swapped back in, or the request left)."""
        self.swap_used -= self.swapped.pop(req, 0)

    def check(self) -> None:
        if self.swap_used != sum(self.swapped.values()) or (
            len(self.keys) + self.swap_used > self.num_blocks
        ):
            raise RuntimeError(
                f"CPU KV tier out of balance: {len(self.keys)} prefix + {self.swap_used} swapped "
                f"blocks in {self.num_blocks} (please report it)"
            )


class BlockPool:
    """One replica's paged KV memory: `num_blocks` blocks of `block_size` tokens, each either
    private to a running request, cached (a full prompt block others may share, evicted LRU
    when free blocks run out) or empty; with `caching` off, blocks are never kept for reuse.
    `check()` proves the three kinds add up to the pool."""

    def __init__(
        self, num_blocks: int, block_size: int, caching: bool, cpu: CPUTier | None = None
    ) -> None:
        self.num_blocks, self.block_size, self.caching = num_blocks, block_size, caching
        self.cpu = cpu  # evicted prefix blocks go there
        self.empty = num_blocks  # blocks holding nothing
        self.held: dict[int, int] = {}  # request -> blocks it holds (shared cached ones included)
        self.window_held: dict[int, int] = {}  # request -> sliding-window blocks (hybrid models)
        self.refs: dict[int, int] = {}  # cached key -> running requests holding it
        self.lru: OrderedDict[int, None] = OrderedDict()  # unreferenced cached keys, oldest first
        self.owned: dict[int, list[int]] = {}  # request -> the cached keys it references
        self.hits = 0  # prompt tokens served from the cache
        # waiting requests' matches, kept up to date as keys enter and leave the cache, so a
        # policy ranking the waiting queue by match pays per change, not per look
        # (`tracked_prefix`; LPM on the overloaded prefix-heavy mix: see policies/lpm.py)
        self.tracked: dict[int, int] = {}  # request -> its cached leading blocks
        self._tracked_keys: dict[int, list[int]] = {}  # request -> its keys up to the cap
        self._trackers: dict[int, dict[int, int]] = {}  # key -> {request: its first position}
        self.match_version = 0  # changes whenever a tracked match does

    @property
    def free(self) -> int:
        return self.empty + len(self.lru)

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # ---- prefix cache -------------------------------------------------------------------
    def cached_prefix(self, keys: list[int], num_tokens: int) -> int:
        """Leading blocks of `keys` in the cache, capped so at most num_tokens - 1 tokens hit."""
        if not self.caching:
            return 0
        cap = (num_tokens - 1) // self.block_size
        n = 0
        for key in keys[:cap]:
            if key not in self.refs:
                break
            n += 1
        return n

    def cpu_prefix(self, keys: list[int], gpu_blocks: int, num_tokens: int) -> int:
        """Blocks of `keys` after the first `gpu_blocks` (the GPU's hit) that the CPU tier holds,
        under the same cap as `cached_prefix`."""
        if self.cpu is None or not self.caching:
            return 0
        cap = (num_tokens - 1) // self.block_size
        return self.cpu.run(keys[gpu_blocks:cap])

    def tracked_prefix(self, req: int, keys: list[int], num_tokens: int) -> int:
        """`cached_prefix` of a waiting request, tracked from now on until it is admitted (or
        `untrack`ed): later calls cost a lookup."""
        n = self.tracked.get(req)
        if n is None:
            capped = keys[: (num_tokens - 1) // self.block_size] if self.caching else []
            n = self.cached_prefix(keys, num_tokens)
            self.tracked[req] = n
            self._tracked_keys[req] = capped
            for pos, key in enumerate(capped):
                self._trackers.setdefault(key, {}).setdefault(req, pos)
        return n

    def untrack(self, req: int) -> None:
        keys = self._tracked_keys.pop(req, None)
        if keys is None:
            return
        del self.tracked[req]
        for key in keys:
            watchers = self._trackers[key]
            watchers.pop(req, None)
            if not watchers:
                del self._trackers[key]

    def _key_left(self, watchers: dict[int, int]) -> None:
        """A key left the cache: a tracked match running past it now ends there."""
        for req, pos in watchers.items():
            if self.tracked[req] > pos:
                self.tracked[req] = pos
                self.match_version += 1

    def _key_entered(self, watchers: dict[int, int]) -> None:
        """A key entered the cache: a tracked match ending at it now runs on."""
        refs = self.refs
        for req, pos in watchers.items():
            if self.tracked[req] == pos:
                keys = self._tracked_keys[req]
                n = pos + 1
                while n < len(keys) and keys[n] in refs:
                    n += 1
                self.tracked[req] = n
                self.match_version += 1

    def _reference(self, req: int, keys: list[int], skipped: int = 0) -> None:
        """`req` holds the cached `keys` (its leading blocks, by position) from `skipped` on."""
        refs, lru = self.refs, self.lru
        for key in keys[skipped:]:
            n = refs[key]
            if n == 0:
                del lru[key]
            refs[key] = n + 1
        self.owned[req] = list(keys)

    # ---- allocation ---------------------------------------------------------------------
    def _admission_skip(self, hit_blocks: int, tokens: int, computed: int) -> int:
        """Leading blocks an admitted request does not hold (`SlidingBlockPool`: those its
        window has left behind); here none."""
        return 0

    def fits(
        self, keys: list[int], hit_blocks: int, tokens: int, reserve: int, computed: int = -1
    ) -> bool:
        """Whether `admit` would succeed (it changes nothing)."""
        skipped = self._admission_skip(hit_blocks, tokens, computed)
        new = self.blocks_for(tokens) - max(hit_blocks, skipped)
        lru = self.lru  # the cached blocks no running request holds
        reused_free = sum(1 for key in keys[skipped:hit_blocks] if key in lru)
        return new <= self.free - reused_free - reserve

    def admit(
        self,
        req: int,
        keys: list[int],
        hit_blocks: int,
        tokens: int,
        reserve: int,
        computed: int = -1,
    ) -> None:
        """Give a waiting request its first `tokens` tokens' blocks, the first `hit_blocks` from
        the cache, keeping at least `reserve` blocks free (the caller checked `fits`; `check`
        finds any imbalance). `computed`: tokens whose KV it has once admitted, when more than
        its cache hit (KV loaded or moved in: `WindowedBlockPool` reads it)."""
        skipped = self._admission_skip(hit_blocks, tokens, computed)
        self._reference(req, keys[:hit_blocks], skipped)
        self._take(self.blocks_for(tokens) - max(hit_blocks, skipped))
        self.held[req] = self.blocks_for(tokens)
        self.untrack(req)  # no longer waiting

    def moved_tokens(self, req: int, tokens: int, hit_blocks: int) -> int:
        """The KV a request admitted with `tokens` tokens computed elsewhere (`admit` with
        `computed`) has moved in, in tokens of this pool's blocks' layers: all but its cache
        hit's."""
        return tokens - hit_blocks * self.block_size

    def grow(self, req: int, tokens: int) -> bool:
        """Make a running request hold blocks for `tokens` tokens; False (nothing changes) if
        the pool is short."""
        new = self.blocks_for(tokens) - self.held[req]
        if new <= 0:
            return True
        if new > self.free:
            return False
        self._take(new)
        self.held[req] += new
        return True

    def add_token_each(self, rows: list[int], computed: list[int]) -> bool:
        """Each of `rows` (holding blocks for exactly `computed[r]` tokens, or more) computes one
        more token: those whose blocks are full take one more. False (nothing changes) if the
        pool is short."""
        held, size = self.held, self.block_size
        full = [r for r in rows if computed[r] == held[r] * size]
        if len(full) > self.free:
            return False
        for r in full:
            held[r] += 1
        self._take(len(full))
        return True

    def decode_steps_that_fit(self, rows: list[int], tokens: list[int], steps: int) -> int:
        """How many of the next `steps` one-token steps requests `rows` holding blocks for
        exactly `tokens[i]` tokens can all take before the free blocks run out (0: not even
        one)."""
        b, free = self.block_size, self.free
        if free >= len(tokens) * (steps // b + 1):
            return steps  # each needs at most steps // b + 1 blocks
        first = [(-t) % b + 1 for t in tokens]  # the step at which each starts a new block

        def need(j: int) -> int:
            return sum((j - f) // b + 1 for f in first if f <= j)

        if need(steps) <= free:
            return steps
        if need(1) > free:
            return 0
        lo, hi = 1, steps  # need(lo) <= free < need(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(mid) <= free else (lo, mid)
        return lo

    def decode(self, rows: list[int], tokens: list[int], steps: int) -> tuple[list[int], list[int]]:
        """Requests holding blocks for exactly `tokens[i]` tokens each compute one more token in
        each of `steps` steps (`decode_steps_that_fit` said they fit): take their new blocks.
        Returns the KV tokens in use after each step and the cached keys evicted for the new
        blocks, in order (what `shorten` needs to give back the last steps')."""
        b, held = self.block_size, self.held
        grown = [0] * (steps + 1)  # blocks newly taken at each step
        for r, t in zip(rows, tokens, strict=True):
            f = (-t) % b + 1  # the step at which it starts a new block
            if f <= steps:
                held[r] = -(-(t + steps) // b)
                while f <= steps:
                    grown[f] += 1
                    f += b
        in_use = [u * b for u in accumulate(grown[1:], initial=self.used)][1:]
        return in_use, self._take(sum(grown))

    def shorten(
        self, rows: list[int], tokens: list[int], steps: int, kept: int, evicted: list[int]
    ) -> None:
        """A run `decode` took `steps` steps of (evicting `evicted` keys) keeps only its
        first `kept`: the other steps' blocks come back as if never taken, evicted keys to the
        front of the eviction order and the rest to the empty blocks (nothing else touched
        this pool since: its replica was in the run)."""
        back = self._shrink_run(rows, tokens, steps, kept)
        # the shorter run would have taken `back` blocks fewer: the same empty ones first, then
        # the first of the same evictions
        evicted_then = max(0, len(evicted) - back)
        for key in reversed(evicted[evicted_then:]):
            self.refs[key] = 0
            self.lru[key] = None
            self.lru.move_to_end(key, last=False)
            if key in self._trackers:
                self._key_entered(self._trackers[key])
        self.empty += back - (len(evicted) - evicted_then)

    def _shrink_run(self, rows: list[int], tokens: list[int], steps: int, kept: int) -> int:
        """The blocks a run of `steps` steps took for its steps after the first `kept`, given
        back by the requests holding them. Returns how many."""
        b, held = self.block_size, self.held
        back = 0
        for r, t in zip(rows, tokens, strict=True):
            extra = -(-(t + steps) // b) - -(-(t + kept) // b)
            if extra:
                held[r] -= extra
                back += extra
        return back

    def prefill_done(self, req: int) -> None:
        """`req` computed its whole prompt and decodes from now on (`WindowedBlockPool` frees
        the part of its last chunk its window no longer needs)."""

    def _take(self, n: int) -> list[int]:
        """Hand out n blocks: empty ones first, then evict cached ones (the caller checked
        that n <= free). Returns the evicted keys, in order."""
        from_empty = min(n, self.empty)
        self.empty -= from_empty
        evicted = []
        for _ in range(n - from_empty):  # evict the least recently freed cached blocks
            key, _ = self.lru.popitem(last=False)
            del self.refs[key]
            evicted.append(key)
            if self.cpu is not None:
                self.cpu.store(key)
            if key in self._trackers:
                self._key_left(self._trackers[key])
        return evicted

    def register(self, req: int, keys: list[int], computed: int) -> None:
        """After a step: the request's full prompt blocks now computed become cached (first
        writer wins; a duplicate stays private to its request)."""
        if not self.caching:
            return
        owned = self.owned.setdefault(req, [])
        for key in keys[len(owned) : min(len(keys), computed // self.block_size)]:
            if key in self.refs:
                break  # someone else computed it first: the rest of ours stays private
            self.refs[key] = 1
            owned.append(key)
            if key in self._trackers:
                self._key_entered(self._trackers[key])

    def release(self, req: int) -> None:
        """Free everything the request holds (finish or preemption). Cached keys it referenced
        go to the eviction order, its last block first, so a shared prefix outlives its tails."""
        held = self.held.pop(req)
        owned = self.owned.pop(req, [])
        self.empty += held - len(owned)
        refs, lru = self.refs, self.lru
        for key in reversed(owned):
            n = refs[key] - 1
            refs[key] = n
            if n == 0:
                lru[key] = None

    def check(self) -> None:
        if self.cpu is not None:
            self.cpu.check()
        held_private = sum(self.held.values()) - sum(len(k) for k in self.owned.values())
        held_private += sum(self.window_held.values())
        cached = len(self.refs)
        if self.empty < 0 or held_private + cached + self.empty != self.num_blocks:
            raise RuntimeError(
                f"KV blocks out of balance: {held_private} private + {cached} cached + "
                f"{self.empty} empty != {self.num_blocks} (please report it)"
            )


def window_cap(window: int, block_size: int) -> int:
    """Blocks a decoding request holds in one window group once its context passes the window:
    those covering the `window` positions its next token attends to (its own included)."""
    return -(-(window - 1) // block_size) + 1


class WindowedBlockPool(BlockPool):
    """The block pool of a hybrid model (gpt-oss, Gemma 3): besides its full-attention blocks
    (`held`, as in `BlockPool`), a running request holds blocks in `groups` sliding-window
    groups, each covering the tokens its last `window` positions attend to. vLLM's allocator
    (one pool shared by every group, the same block size) frees a window block once the
    request's computed tokens leave it behind and takes blocks for a step's new tokens in every
    group; here, in each group:

    - a step computing tokens c..a-1 (a prompt chunk, or the first at admission) holds
      ceil(a / b) blocks less the floor((c - window + 1) / b) it skipped, at least as many as
      decoding would (a chunk's transient);
    - a decoding request holds min(ceil(a / b), `window_blocks`) blocks, taking one in every
      group when it takes a full-attention block while under the cap; vLLM's count dips by one
      for the step just before (it frees the oldest block a step before the new one is
      needed): this pool keeps the higher count, so a decoding request holds at most one
      block per group more than vLLM for one step in b.

    Window blocks are private (not kept for prefix reuse); a prefix hit spares the full
    layers' blocks only. `computed` is the engine's per-request count of computed tokens,
    read when a running request grows."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        caching: bool,
        window: int,
        groups: int,
        computed: list[int],
    ) -> None:
        super().__init__(num_blocks, block_size, caching)
        self.window, self.groups, self.computed = window, groups, computed
        self.window_blocks = self.most_blocks(window, block_size)

    @staticmethod
    def most_blocks(window: int, block_size: int) -> int:
        """The most blocks a decoding request holds in one group (`window_cap`)."""
        return window_cap(window, block_size)

    def decoding_blocks(self, full_blocks: int) -> int:
        """Window blocks (all groups) of a decoding request holding `full_blocks` blocks."""
        return self.groups * min(full_blocks, self.window_blocks)

    def _step_blocks(self, computed: int, tokens: int) -> int:
        """Window blocks (all groups) of a request computing up to `tokens` tokens from
        `computed`: the blocks from the oldest one its window still reads."""
        b = self.block_size
        full = -(-tokens // b)
        skipped = max(0, computed - self.window + 1) // b
        return self.groups * max(min(full, self.window_blocks), full - skipped)

    def _admitted_window(self, hit_blocks: int, tokens: int, computed: int) -> int:
        """Window blocks of a request admitted with blocks for `tokens` tokens, whose KV it has
        for its cache hit or, when given, `computed` tokens (`BlockPool.admit`)."""
        c = hit_blocks * self.block_size if computed < 0 else computed
        return self._step_blocks(c, tokens)

    def fits(
        self, keys: list[int], hit_blocks: int, tokens: int, reserve: int, computed: int = -1
    ) -> bool:
        window = self._admitted_window(hit_blocks, tokens, computed)
        return super().fits(keys, hit_blocks, tokens, reserve + window)

    def admit(
        self,
        req: int,
        keys: list[int],
        hit_blocks: int,
        tokens: int,
        reserve: int,
        computed: int = -1,
    ) -> None:
        super().admit(req, keys, hit_blocks, tokens, reserve)
        window = self._admitted_window(hit_blocks, tokens, computed)
        self._take(window)
        self.window_held[req] = window

    def moved_tokens(self, req: int, tokens: int, hit_blocks: int) -> int:
        """The full layers' KV less the hit, and in every group the window's tokens (window
        blocks are never cache hits)."""
        skipped = self.held[req] - self.decoding_blocks(self.held[req]) // self.groups
        window = tokens - skipped * self.block_size
        return super().moved_tokens(req, tokens, hit_blocks) + self.groups * window

    def grow(self, req: int, tokens: int) -> bool:
        new = max(0, -(-tokens // self.block_size) - self.held[req])
        window = self._step_blocks(self.computed[req], tokens)
        change = window - self.window_held[req]  # < 0: blocks its window left behind
        if new + change > self.free:
            return False
        if change < 0:
            self.empty -= change  # freed before the new blocks are taken, as vLLM does
        self._take(new + max(0, change))
        self.held[req] += new
        self.window_held[req] = window
        return True

    def add_token_each(self, rows: list[int], computed: list[int]) -> bool:
        held, size, window_held = self.held, self.block_size, self.window_held
        full = [r for r in rows if computed[r] == held[r] * size]
        grown = [self.decoding_blocks(held[r] + 1) - window_held[r] for r in full]
        if len(full) + sum(grown) > self.free:
            return False
        for r, g in zip(full, grown, strict=True):
            held[r] += 1
            window_held[r] += g
        change = len(full) + sum(grown)  # < 0: a chunked window freed more than the step took
        if change >= 0:
            self._take(change)  # (any freed before, as vLLM frees before it takes)
        else:
            self.empty -= change
        return True

    def prefill_done(self, req: int) -> None:
        window = self.decoding_blocks(self.held[req])
        self.empty += self.window_held[req] - window
        self.window_held[req] = window

    def _growth(self, tokens: list[int], steps: int) -> list[int]:
        """Blocks (full and window) requests decoding from `tokens[i]` tokens each take at each
        of the next `steps` steps (index j: step j; index 0 unused)."""
        b, cap, groups = self.block_size, self.window_blocks, self.groups
        grown = [0] * (steps + 1)
        for t in tokens:
            f = (-t) % b + 1  # the step at which it starts a new block
            blocks = -(-t // b)
            while f <= steps:
                blocks += 1
                grown[f] += 1 + (groups if blocks <= cap else 0)
                f += b
        return grown

    def decode_steps_that_fit(self, rows: list[int], tokens: list[int], steps: int) -> int:
        free = self.free
        if free >= len(tokens) * (steps // self.block_size + 1) * (1 + self.groups):
            return steps
        used = 0
        for j, n in enumerate(self._growth(tokens, steps)[1:]):
            used += n
            if used > free:
                return j
        return steps

    def decode(self, rows: list[int], tokens: list[int], steps: int) -> tuple[list[int], list[int]]:
        b, held, window_held = self.block_size, self.held, self.window_held
        for r, t in zip(rows, tokens, strict=True):
            held[r] = -(-(t + steps) // b)
            window_held[r] = self.decoding_blocks(held[r])
        grown = self._growth(tokens, steps)
        in_use = [u * b for u in accumulate(grown[1:], initial=self.used)][1:]
        return in_use, self._take(sum(grown))

    def _shrink_run(self, rows: list[int], tokens: list[int], steps: int, kept: int) -> int:
        back = super()._shrink_run(rows, tokens, steps, kept)
        held, window_held = self.held, self.window_held
        for r in rows:
            window = self.decoding_blocks(held[r])
            back += window_held[r] - window
            window_held[r] = window
        return back

    def release(self, req: int) -> None:
        super().release(req)
        self.empty += self.window_held.pop(req, 0)


class StateBlockPool(WindowedBlockPool):
    """The block pool of a model with recurrent layers (Qwen3-Next, Qwen3.5, Granite 4.0-H,
    Nemotron-H): besides its attention blocks, a running request holds `pages` blocks in each
    of `groups` state groups from its admission to its end, as vLLM's hybrid allocator keeps a
    request's recurrent state (a page per group, the block size chosen so that a page holds
    it: `state_block_size`; with prefix caching on, vLLM keeps a second page per group, for
    the state at the last block boundary). The window groups' bookkeeping, the windows a
    constant count. Prefix hits are not modelled: a hit would need the state where it ends."""

    def __init__(
        self, num_blocks: int, block_size: int, groups: int, pages: int, computed: list[int]
    ) -> None:
        super().__init__(num_blocks, block_size, False, 1, groups, computed)
        self.pages = pages

    def decoding_blocks(self, full_blocks: int) -> int:
        return self.groups * self.pages if full_blocks else 0

    def _step_blocks(self, computed: int, tokens: int) -> int:
        return self.groups * self.pages if tokens > 0 else 0

    def _growth(self, tokens: list[int], steps: int) -> list[int]:
        """Blocks requests decoding from `tokens[i]` tokens each take at each of the next
        `steps` steps: attention blocks only (the states' pages are all taken at admission)."""
        b = self.block_size
        grown = [0] * (steps + 1)
        for t in tokens:
            for f in range((-t) % b + 1, steps + 1, b):  # the steps starting a new block
                grown[f] += 1
        return grown

    def moved_tokens(self, req: int, tokens: int, hit_blocks: int) -> int:
        """The attention layers' KV and, in every group, whole pages: the state fills them."""
        state = self.groups * self.pages * self.block_size
        return BlockPool.moved_tokens(self, req, tokens, hit_blocks) + state


class ChunkedBlockPool(WindowedBlockPool):
    """The block pool of a model with chunked local attention (Llama 4: three layers in four
    attend only within their own `window`-token chunk of the context): the chunked layers'
    groups hold, as vLLM's allocator keeps them, the blocks of the chunk a request's computed
    tokens are in, all freed when it passes into the next chunk. The window is a whole number of
    blocks. A run of decode steps stops before a step that starts a new chunk for any of its
    requests (where a window's blocks go back), so within a run each new block takes one in
    every group."""

    @staticmethod
    def most_blocks(window: int, block_size: int) -> int:
        """The blocks of one chunk."""
        if window % block_size:
            raise ConfigError(
                f"engine.block_size={block_size}: a model's attention chunk ({window} tokens) "
                "must be a whole number of blocks"
            )
        return window // block_size

    def decoding_blocks(self, full_blocks: int) -> int:
        """Window blocks (all groups) of a decoding request holding `full_blocks` blocks: those
        of its last block's chunk."""
        return self.groups * ((full_blocks - 1) % self.window_blocks + 1) if full_blocks else 0

    def _step_blocks(self, computed: int, tokens: int) -> int:
        """Window blocks (all groups) of a request computing up to `tokens` tokens from
        `computed`: from the first block of the chunk position `computed` is in. With nothing
        to compute (its KV moved or loaded in), what it holds decoding (vLLM frees the chunk
        before it at its next step)."""
        b = self.block_size
        if computed == tokens:
            return self.decoding_blocks(-(-tokens // b))
        return self.groups * (-(-tokens // b) - computed // self.window * self.window_blocks)

    def _growth(self, tokens: list[int], steps: int) -> list[int]:
        """Blocks requests decoding from `tokens[i]` tokens each take at each of the next
        `steps` steps, none of which starts a chunk (`decode_steps_that_fit`)."""
        b, per_block = self.block_size, 1 + self.groups
        grown = [0] * (steps + 1)
        for t in tokens:
            for f in range((-t) % b + 1, steps + 1, b):  # the steps starting a new block
                grown[f] += per_block
        return grown

    def decode_steps_that_fit(self, rows: list[int], tokens: list[int], steps: int) -> int:
        b, chunk = self.block_size, self.window_blocks
        for t in tokens:
            blocks = -(-t // b)
            # the crossing into block `blocks + i` starts a chunk when it is a multiple of chunk
            first = (-t) % b + 1 + (-blocks) % chunk * b
            steps = min(steps, first - 1)
        return super().decode_steps_that_fit(rows, tokens, steps)


class SlidingBlockPool(BlockPool):
    """The block pool of a model whose every layer attends to its last `window` tokens only
    (Mistral 7B v0.1, Phi-3 4k): vLLM keeps one group of blocks and frees a request's blocks
    once its computed tokens leave them behind, so a request holds at most `window_blocks`
    (`window_cap`) however long its context. Here `held[req]` counts the blocks covering its
    tokens, as in `BlockPool`, of which the first `skipped[req]` are released (vLLM's null
    blocks):

    - a step computing tokens c..a-1 releases the blocks before position c - window + 1, keeping
      at least as many as decoding would (a chunk's transient, as in `WindowedBlockPool`);
    - a decoding request holds min(held, window_blocks): past the window it releases its oldest
      block as it takes a new one (vLLM frees it a step earlier: this pool keeps the higher
      count for that step);
    - a released block that is a cached prefix block stays cached, unreferenced; a prefix hit
      counts from the first block, as in `BlockPool` (vLLM also takes a hit whose window's
      blocks are cached after earlier ones were evicted).

    A run of decode steps stops before a step that would release a cached block (whether that
    frees one depends on who else holds it): within a run each block released is private and
    the new one takes its place. `computed` is the engine's per-request count of computed
    tokens, read when a running request grows."""

    def __init__(
        self, num_blocks: int, block_size: int, caching: bool, window: int, computed: list[int]
    ) -> None:
        super().__init__(num_blocks, block_size, caching)
        self.window, self.computed = window, computed
        self.window_blocks = window_cap(window, block_size)
        self.skipped: dict[int, int] = {}  # request -> its leading blocks released

    def _skip_target(self, computed: int, blocks: int) -> int:
        """Leading blocks released once a request with `computed` tokens holds `blocks`
        blocks' positions: those before computed - window + 1, leaving at least the window."""
        reach = (computed - self.window + 1) // self.block_size
        return max(0, min(reach, blocks - self.window_blocks))

    def _releasing(self, req: int, upto: int) -> tuple[list[int], int]:
        """What `req` releases moving its first held block to `upto`: the cached keys it holds
        there, by position, and the number of private blocks."""
        start, owned = self.skipped[req], self.owned.get(req, [])
        keys = owned[start : min(upto, len(owned))]
        return keys, max(0, upto - max(start, len(owned)))

    def _freed(self, keys: list[int], private: int) -> int:
        """Blocks that become free when `private` blocks and one reference to each of `keys`
        (a key once per request holding it) are released."""
        return private + sum(1 for key, n in Counter(keys).items() if self.refs[key] == n)

    def _release_leading(self, req: int, upto: int) -> None:
        keys, private = self._releasing(req, upto)
        self.skipped[req] = max(self.skipped[req], upto)
        self.empty += private
        refs, lru = self.refs, self.lru
        for key in reversed(keys):  # the last first, as vLLM frees them
            n = refs[key] - 1
            refs[key] = n
            if n == 0:
                lru[key] = None

    def _admission_skip(self, hit_blocks: int, tokens: int, computed: int) -> int:
        """The blocks before the window of a request admitted with blocks for `tokens` tokens,
        whose KV it has for its hit or, when given, `computed` tokens."""
        c = hit_blocks * self.block_size if computed < 0 else computed
        return self._skip_target(c, self.blocks_for(tokens))

    def admit(
        self,
        req: int,
        keys: list[int],
        hit_blocks: int,
        tokens: int,
        reserve: int,
        computed: int = -1,
    ) -> None:
        super().admit(req, keys, hit_blocks, tokens, reserve, computed)
        self.skipped[req] = self._admission_skip(hit_blocks, tokens, computed)

    def moved_tokens(self, req: int, tokens: int, hit_blocks: int) -> int:
        """Only the window's tokens exist to move, less the hit."""
        return tokens - max(hit_blocks, self.skipped[req]) * self.block_size

    def register(self, req: int, keys: list[int], computed: int) -> None:
        if self.skipped.get(req, 0) > len(self.owned.get(req, [])):
            return  # its cached run ends at a released block: the blocks after stay private
        super().register(req, keys, computed)

    def grow(self, req: int, tokens: int) -> bool:
        blocks = max(self.held[req], self.blocks_for(tokens))
        new = blocks - self.held[req]
        upto = max(self.skipped[req], self._skip_target(self.computed[req], blocks))
        keys, private = self._releasing(req, upto)
        if new > self.free + self._freed(keys, private):
            return False
        self._release_leading(req, upto)  # freed before the new blocks are taken, as vLLM does
        self._take(new)
        self.held[req] = blocks
        return True

    def add_token_each(self, rows: list[int], computed: list[int]) -> bool:
        held, size, cap = self.held, self.block_size, self.window_blocks
        full = [r for r in rows if computed[r] == held[r] * size]
        passing = [r for r in full if held[r] + 1 > cap]  # each releases its oldest block
        released = [self._releasing(r, held[r] + 1 - cap) for r in passing]
        keys = [key for ks, _ in released for key in ks]
        if len(full) > self.free + self._freed(keys, sum(p for _, p in released)):
            return False
        for r in passing:
            self._release_leading(r, held[r] + 1 - cap)
        for r in full:
            held[r] += 1
        self._take(len(full))
        return True

    def prefill_done(self, req: int) -> None:
        self._release_leading(req, max(0, self.held[req] - self.window_blocks))

    def _growth(self, tokens: list[int], steps: int) -> list[int]:
        """Blocks requests decoding from `tokens[i]` tokens each take at each of the next
        `steps` steps, past the window none (index j: step j; index 0 unused)."""
        b, cap = self.block_size, self.window_blocks
        grown = [0] * (steps + 1)
        for t in tokens:
            f = (-t) % b + 1  # the step at which it starts a new block
            blocks = -(-t // b)
            while f <= steps and blocks < cap:
                blocks += 1
                grown[f] += 1
                f += b
        return grown

    def decode_steps_that_fit(self, rows: list[int], tokens: list[int], steps: int) -> int:
        b, cap = self.block_size, self.window_blocks
        for r, t in zip(rows, tokens, strict=True):
            if self.skipped[r] < len(self.owned.get(r, ())):  # it holds cached blocks
                blocks = -(-t // b)
                first = (-t) % b + 1 + max(0, cap - blocks) * b  # its first release
                steps = min(steps, first - 1)  # a run stops before it
        used = 0
        for j, n in enumerate(self._growth(tokens, steps)[1:]):
            used += n
            if used > self.free:
                return j
        return steps

    def decode(self, rows: list[int], tokens: list[int], steps: int) -> tuple[list[int], list[int]]:
        b, held, skipped, cap = self.block_size, self.held, self.skipped, self.window_blocks
        for r, t in zip(rows, tokens, strict=True):
            held[r] = -(-(t + steps) // b)
            skipped[r] = max(skipped[r], held[r] - cap)  # private blocks, reused
        grown = self._growth(tokens, steps)
        in_use = [u * b for u in accumulate(grown[1:], initial=self.used)][1:]
        return in_use, self._take(sum(grown))

    def _shrink_run(self, rows: list[int], tokens: list[int], steps: int, kept: int) -> int:
        b, held, skipped, cap = self.block_size, self.held, self.skipped, self.window_blocks
        grown = self._growth(tokens, steps)
        for r, t in zip(rows, tokens, strict=True):
            held[r] = -(-(t + kept) // b)
            skipped[r] = max(0, held[r] - cap)  # a decoding request holds the window
        return sum(grown[kept + 1 :])

    def release(self, req: int) -> None:
        held, skipped = self.held.pop(req), self.skipped.pop(req)
        owned = self.owned.pop(req, [])
        self.empty += held - max(skipped, len(owned))
        refs, lru = self.refs, self.lru
        for key in reversed(owned[skipped:]):
            n = refs[key] - 1
            refs[key] = n
            if n == 0:
                lru[key] = None

    def check(self) -> None:
        owned = self.owned
        held_private = sum(
            held - max(self.skipped[r], len(owned.get(r, []))) for r, held in self.held.items()
        )
        cached = len(self.refs)
        if self.empty < 0 or held_private + cached + self.empty != self.num_blocks:
            raise RuntimeError(
                f"KV blocks out of balance: {held_private} private + {cached} cached + "
                f"{self.empty} empty != {self.num_blocks} (please report it)"
            )
