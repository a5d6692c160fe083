"""The step-time seam: how long one GPU step takes. (Fairness *service* prices live elsewhere.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class CostModelError(ValueError):
    """A cost-model setting or profile that cannot be used; the message names the key or file."""


class StepCostModel(Protocol):
    """How long a step takes. Optional, read where present: `step_time` (a mixed step priced
    as a whole), `kv_capacity_tokens` (the KV pool a GPU leaves), `kv_window` (the sliding
    layers' window and groups, held per request beside the pool's blocks), `all_layers_window`
    (the window every layer of a model attends to, when every layer slides),
    `step_overhead`, and
    `frontend_latency` (seconds from a client's send to the engine's queue: the runner
    delivers requests that much later and counts their latencies from the send)."""

    def prefill_time(self, prompt_lens: np.ndarray) -> float:
        """Seconds for one prefill-only step over requests with these prompt lengths."""
        ...

    def decode_times(self, batch_size: int, context_tokens: np.ndarray) -> np.ndarray:
        """Seconds of consecutive decode steps of `batch_size` requests.

        `context_tokens[j]` is the KV tokens the batch attends to in step j. The engine calls this
        once per fast-forward run (and with one element when stepping), so implementations must be
        element-wise: the same step gets the same time however many steps are asked for at once.
        """
        ...

    def decode_time(self, batch_size: int, context_tokens: int) -> float:
        """Seconds of one decode step: exactly `decode_times(batch_size, [context_tokens])[0]`
        (the engine's hot path when it steps one at a time)."""
        ...


def mixed_step_time(
    cost: StepCostModel, chunks: list[tuple[int, int]], decode_batch: int, decode_context: int
) -> float:
    """Seconds for one step of a chunked-prefill engine: prefill `chunks` of (new tokens, tokens
    already cached) next to `decode_batch` decodes attending to `decode_context` tokens.

    Models that price mixed steps themselves (the roofline ones: `step_time`) are asked
    directly. Otherwise the step costs a prefill step over the chunks' new tokens plus, when
    decodes ride along, their decode work without a second fixed overhead (`step_overhead`).
    """
    step_time = getattr(cost, "step_time", None)
    if step_time is not None:
        return float(step_time(chunks, decode_batch, decode_context))
    t = cost.prefill_time(np.array([n for n, _ in chunks], dtype=np.int64))
    if decode_batch:
        t += cost.decode_time(decode_batch, decode_context) - float(
            getattr(cost, "step_overhead", 0.0)
        )
    return float(t)


def step_shape(
    chunks: Sequence[tuple[int, int]],
    decode_batch: int,
    decode_context: int,
    window: tuple[int, float] | None = None,
    chunked: bool = False,
) -> tuple[int, float, float]:
    """A mixed step's (tokens, (query, key) pairs, KV tokens read) from its prefill `chunks` of
    (new tokens, tokens already cached) and `decode_batch` decodes attending to
    `decode_context` tokens: a chunk of c after k cached forms c k + c (c + 1) / 2 pairs.
    Pairs and KV count the layers attending to the whole context; with `window` (tokens, r),
    a model's sliding layers, r times as many, add theirs (`windowed_pairs`; a decode reads
    at most the window: `windowed_decode_step`), in those layers' units; `chunked`, layers
    attending within consecutive chunks of the window's size instead (`chunked_pairs`; a chunk
    reads the KV of its first token's chunk, a decode at most a chunk's)."""
    tokens, pairs, kv_read = decode_batch, float(decode_context), float(decode_context)
    for c, k in chunks:
        tokens += c
        pairs += c * k + c * (c + 1) / 2
        kv_read += k
    if window is not None:
        size, ratio = window
        slid = read = float(min(decode_context, decode_batch * size))
        pairs_of = chunked_pairs if chunked else windowed_pairs
        for c, k in chunks:
            slid += pairs_of(k + c, size) - pairs_of(k, size)
            read += k % size if chunked else min(k, size)
        pairs += ratio * slid
        kv_read += ratio * (read + tokens)  # (the full layers' new tokens: the caller's)
    return tokens, pairs, kv_read


def slid_step_shape(
    chunks: Sequence[tuple[int, int]], decode_batch: int, decode_context: int, window: int
) -> tuple[int, float, float]:
    """`step_shape` of a model whose every layer attends to its last `window` tokens: a prompt
    token forms at most the window's pairs, a chunk reads at most the window's cached KV and the
    decodes at most a window each (min(context, requests x window), exact when every context
    is on the same side of the window). Within the window, full attention's figures exactly."""
    read = float(min(decode_context, decode_batch * window))
    tokens, pairs, kv_read = decode_batch, read, read
    for c, k in chunks:
        tokens += c
        pairs += windowed_pairs(k + c, window) - windowed_pairs(k, window)
        kv_read += min(k, window)
    return tokens, pairs, kv_read


def windowed_pairs(position: int, window: int) -> float:
    """(query, key) pairs of the first `position` tokens in a layer where each attends to at
    most `window` tokens (itself included)."""
    if position <= window:
        return position * (position + 1) / 2
    return window * (window + 1) / 2 + (position - window) * window


def chunked_pairs(position: int, chunk: int) -> float:
    """(query, key) pairs of the first `position` tokens in a layer where each attends to the
    tokens of its own `chunk`-token chunk up to itself."""
    whole, rest = divmod(position, chunk)
    return whole * (chunk * (chunk + 1) / 2) + rest * (rest + 1) / 2


def windowed_decode_step(ctx: Any, batch: int, window: tuple[int, float]) -> tuple[Any, Any]:
    """(pairs, KV tokens read and written) of a decode-only step of `batch` requests attending
    to `ctx` tokens in all (a number, or an array of steps) with sliding layers: each reads at
    most the window, min(ctx, batch x window), exact when every context is on the same side of
    the window (the engine passes the sum alone). The same operations in the same order as
    `step_shape`, so a step timed either way gives the same float."""
    size, ratio = window
    slid = np.minimum(ctx, batch * size)
    return ctx + ratio * slid, (ctx + ratio * (slid + batch)) + batch


Sparse = tuple[int, float, float, float]  # `ModelSpec.sparse_attention`


def sparse_step_shape(
    chunks: Sequence[tuple[int, int]], decode_batch: int, decode_context: int, sparse: Sparse
) -> tuple[int, float, float]:
    """`step_shape` of a sparse-attention model (`ModelSpec.sparse_attention`: top-k, the
    indexer's FLOPs per pair, the latent's and the indexer key's shares of a token's KV), in
    full attention's units. The indexer scores every cached token for every query: the whole
    context's pairs and index keys. Attention forms at most top-k pairs a query (a prompt token
    at position p: min(p, top-k)); a decode reads at most top-k latents
    (min(context, requests x top-k), exact when every context is on the same side of top-k);
    a chunk of prompt may pick any cached token, so it reads every cached latent."""
    topk, indexer_flops, latent_share, key_share = sparse
    picked = float(min(decode_context, decode_batch * topk))
    tokens, pairs, every, latents = decode_batch, picked, float(decode_context), picked
    cached = float(decode_context)  # every cached token's index key
    for c, k in chunks:
        tokens += c
        pairs += windowed_pairs(k + c, topk) - windowed_pairs(k, topk)
        every += c * k + c * (c + 1) / 2
        latents += k
        cached += k
    return tokens, pairs + indexer_flops * every, latent_share * latents + key_share * cached


def sparse_decode_step(ctx: Any, batch: int, sparse: Sparse) -> tuple[Any, Any]:
    """(pairs, KV tokens read and written) of a decode-only step of `batch` requests attending
    to `ctx` tokens in all (a number, or an array of steps) on a sparse-attention model: the
    same operations in the same order as `sparse_step_shape`, so a step timed either way gives
    the same float."""
    topk, indexer_flops, latent_share, key_share = sparse
    picked = np.minimum(ctx, batch * topk)
    return picked + indexer_flops * ctx, (latent_share * picked + key_share * ctx) + batch


def state_decode_step(ctx: Any, batch: int, state: float) -> tuple[Any, Any]:
    """(pairs, KV tokens read and written) of a decode-only step of `batch` requests attending
    to `ctx` tokens in all, on a model whose recurrent layers read and write each request's
    state, `state` tokens' worth of KV bytes: the operations `RooflineCost._shape` does, in
    its order."""
    return ctx, (ctx + batch * state) + batch
