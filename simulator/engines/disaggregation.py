"""Prefill/decode disaggregation: a prefill pool and a decode pool joined by a KV transfer
(`cluster.prefill_replicas` > 0; `cluster.disaggregation` configures it).

A request's journey, as vLLM's P/D connectors and llm-d's router run it:
1. on arrival the decode dispatcher picks its decode replica; the decider then says whether its
   prompt is computed on the prefill pool (`always`, `never`, `prompt_above` a threshold, or
   `cache_miss_above`: the prompt tokens that decode replica's prefix cache lacks);
2. disaggregated: the prefill dispatcher picks a prefill replica, which admits it under its own
   policy, computes the prompt and samples the first token (the client gets it then); the
   request leaves that replica's running batch, its KV blocks stay held there;
3. it joins the decode replica's waiting queue; admitted in that policy's order when the blocks
   for its prompt fit (blocks its prefix cache holds are not moved), the KV moves over the link
   (`KVLink`: a base latency plus bytes / bandwidth, optionally one shared link that queues);
4. when the transfer ends the prefill replica frees its blocks and the request decodes on the
   decode replica from its second token on. Not disaggregated: it runs whole on its decode
   replica, as a co-located engine does.

Fairness: each replica runs a copy of the policy (`counters: per_pool`), or one policy object
keeps one set of per-client counters charged by both pools' service (`counters: shared`: prompt
tokens on the prefill pool, output tokens on the decode pool; global_vtc's direction).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from simulator.core.errors import ConfigError
from simulator.engines.kv_blocks import kv_token_bytes

DECIDERS = ("always", "never", "prompt_above", "cache_miss_above")
COUNTERS = ("per_pool", "shared")


@dataclass(frozen=True)
class DisaggregationConfig:
    """`cluster.disaggregation`: how requests cross from the prefill pool to the decode pool."""

    decider: str = "always"
    threshold: int = 0  # tokens, for prompt_above and cache_miss_above
    prefill_dispatcher: str = "least_requests"
    decode_dispatcher: str = "least_requests"
    link_bandwidth_gbps: float = 25.0  # GB/s each transfer gets (one link: all of them share it)
    link_latency: float = 0.002  # seconds every transfer adds (connector handshake, setup)
    shared_link: bool = False  # one link between the pools: transfers queue for it, in order
    kv_bytes_per_token: int | None = None  # null: the cost model's (model and dtype)
    counters: str = "per_pool"
    # overrides of the engine and cost-model settings for each pool (other GPUs, other limits)
    prefill_engine: Mapping[str, Any] = field(default_factory=dict)
    decode_engine: Mapping[str, Any] = field(default_factory=dict)
    prefill_cost_model: Mapping[str, Any] = field(default_factory=dict)
    decode_cost_model: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        key = "cluster.disaggregation"
        if self.decider not in DECIDERS:
            raise ConfigError(f"{key}.decider must be one of {DECIDERS}, got {self.decider!r}")
        if self.counters not in COUNTERS:
            raise ConfigError(f"{key}.counters must be one of {COUNTERS}, got {self.counters!r}")
        t = self.threshold
        if not (_number(t) and float(t).is_integer() and t >= 0):
            raise ConfigError(f"{key}.threshold must be an integer >= 0 (tokens), got {t!r}")
        bw = self.link_bandwidth_gbps
        if not (_number(bw) and bw > 0):
            raise ConfigError(f"{key}.link_bandwidth_gbps must be a number > 0, got {bw!r}")
        lat = self.link_latency
        if not (_number(lat) and lat >= 0):
            raise ConfigError(f"{key}.link_latency must be a number of seconds >= 0, got {lat!r}")
        if not isinstance(self.shared_link, bool):
            raise ConfigError(f"{key}.shared_link must be true or false, got {self.shared_link!r}")
        b = self.kv_bytes_per_token
        if b is not None and not (_number(b) and float(b).is_integer() and b >= 1):
            raise ConfigError(
                f"{key}.kv_bytes_per_token must be null or an integer >= 1, got {b!r}"
            )
        for name in ("prefill_engine", "decode_engine", "prefill_cost_model", "decode_cost_model"):
            if not isinstance(getattr(self, name), Mapping):
                raise ConfigError(f"{key}.{name} must be a mapping of settings, got {name!r}")

    def transfer_bytes_per_token(self, cost: object) -> int:
        """KV bytes one token moves: the configured figure, else the cost model's model."""
        return kv_token_bytes(
            self.kv_bytes_per_token, cost, "cluster.disaggregation.kv_bytes_per_token"
        )

    def disaggregates(self, prompt: int, cached: int) -> bool:
        """Whether a request of `prompt` tokens, `cached` of them in its decode replica's
        prefix cache, has its prompt computed on the prefill pool."""
        if self.decider == "always":
            return True
        if self.decider == "never":
            return False
        if self.decider == "prompt_above":
            return prompt > self.threshold
        return prompt - cached > self.threshold


def _number(v: object) -> bool:
    """A finite int or float (not a bool, not text)."""
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


def with_settings(obj: Any, settings: Mapping[str, Any], key: str) -> Any:
    """A copy of a frozen config dataclass with some fields replaced (a pool's own engine or
    cost model); an unknown field is an error naming it and the accepted ones."""
    if not settings:
        return obj
    names = {f.name for f in fields(obj)} if hasattr(obj, "__dataclass_fields__") else set()
    unknown = sorted(set(settings) - names)
    if unknown:
        raise ConfigError(
            f"cluster.disaggregation.{key}: unknown setting(s) {unknown} for "
            f"{type(obj).__name__}; accepted: {sorted(names)}"
        )
    return replace(obj, **dict(settings))


class KVLink:
    """The link KV moves over: a transfer of b bytes started at t ends at t + latency +
    b / bandwidth; on a shared link transfers go one at a time in the order they start."""

    def __init__(self, bandwidth_gbps: float, latency: float, shared: bool) -> None:
        self.bytes_per_second = bandwidth_gbps * 1e9
        self.latency, self.shared = latency, shared
        self.free_at = 0.0  # a shared link: when the transfer under way ends its bytes

    def transfer(self, nbytes: int, now: float) -> float:
        """When a transfer of `nbytes` asked for at `now` ends."""
        wire = nbytes / self.bytes_per_second
        if not self.shared:
            return now + self.latency + wire
        start = max(now, self.free_at)
        self.free_at = start + wire
        return self.free_at + self.latency
