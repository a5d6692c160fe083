"""The multi-tenant gateway in front of the replicas (`gateway:`): what an inference gateway
(the Gateway API inference extension's endpoint picker, llm-d's router) decides before any
engine sees a request.

1. Admission, on arrival (`gateway.admission.type`):
   - always: every request passes;
   - token_bucket: a global bucket (`rate` cost units per second, `burst` deep) and one per
     tenant (`tenant_rate`, `tenant_burst`); a request costs input_cost x prompt + output_cost
     x output tokens and passes only if every bucket holds its cost (then taken from each);
   - tier_shedding: under overload — queued requests (the replicas' queues and the gateway's)
     per replica at or above `overload_queue_depth` — the lowest tier (background) is shed, at
     twice that depth batch too, at three times sheddable too; standard and critical never;
   - saturation: the inference extension's legacy admission: while the pool is saturated (see
     below), requests of a negative priority (sheddable, batch, background) are rejected.
   A request turned away ends `rejected` with reason `gateway_rate_limited`,
   `gateway_tier_shed` or `gateway_saturated`.
2. Flow control (`gateway.flow_control.enabled`): admitted requests wait at the gateway in one
   queue per priority band (SLO_PRIORITY of their class), a lane per tenant inside it, and are
   dispatched — highest band first, across a band's tenants by `fairness` (fcfs, round_robin,
   wfq, vtc, drr: policies run through the seam, with their own counters) — only while the pool
   is not saturated. A full gateway (`queue_bound` requests) rejects arrivals
   (`gateway_queue_full`); a request waiting `ttl` seconds is rejected (`gateway_ttl_expired`).
   The engines' own policy still runs behind it.

The pool is saturated when no replica has room, a replica having room while it has fewer than
`saturation.queue_depth` requests waiting and less than `saturation.kv_utilization` of its KV
pool in use after its last step (the inference extension's legacy saturation detector and its
defaults, 5 and 0.8), read at the instant the gateway decides.

The fairness policy is charged through the seam as the gateway sees service: a request's prompt
tokens when it is dispatched, its output tokens (all of them: every one passed the gateway) when
its stream ends (`docs/metrics.md` bounds the difference between two backlogged tenants' service
under VTC with it).
"""

from __future__ import annotations

import copy
import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.requests import CLIENT_TIMEOUT
from simulator.core.seam import (
    ADMIT,
    CounterPolicy,
    Drop,
    Finished,
    Left,
    OutputTokens,
    Policy,
    PromptTokens,
)
from simulator.engines.step_model import StepModel
from traces.schema import SLO_CLASSES, SLO_PRIORITY, Trace

ADMISSIONS = ("always", "token_bucket", "tier_shedding", "saturation")
FAIRNESS = ("fcfs", "round_robin", "wfq", "vtc", "drr")
# tier shedding: the classes shed in turn as the overload grows (the k-th at k x the depth)
SHED_ORDER = ("background", "batch", "sheddable")

# the reasons of requests the gateway turns away, and of those waiting there at the horizon
RATE_LIMITED, TIER_SHED = "gateway_rate_limited", "gateway_tier_shed"
SATURATED, QUEUE_FULL = "gateway_saturated", "gateway_queue_full"
TTL_EXPIRED, QUEUED = "gateway_ttl_expired", "gateway_queued"


def _number(key: str, v: object, minimum: float, strict: bool, optional: bool = False) -> None:
    if optional and v is None:
        return
    ok = (
        not isinstance(v, bool)
        and isinstance(v, int | float)
        and math.isfinite(v)
        and (v > minimum if strict else v >= minimum)
    )
    if not ok:
        what = f"a number {'>' if strict else '>='} {minimum:g}" + (" or null" if optional else "")
        raise ConfigError(f"gateway.{key} must be {what}, got {v!r}")


@dataclass(frozen=True)
class SaturationConfig:
    queue_depth: int = 5
    kv_utilization: float = 0.8

    def __post_init__(self) -> None:
        _number("saturation.queue_depth", self.queue_depth, 1, strict=False)
        if int(self.queue_depth) != self.queue_depth:
            raise ConfigError(
                f"gateway.saturation.queue_depth must be an integer >= 1, got {self.queue_depth!r}"
            )
        _number("saturation.kv_utilization", self.kv_utilization, 0, strict=True)


@dataclass(frozen=True)
class AdmissionConfig:
    type: str = "always"
    rate: float | None = None  # token_bucket: cost units per second (null: no global bucket)
    burst: float | None = None  # the bucket's depth (null: one second of `rate`)
    tenant_rate: float | None = None  # the same per tenant (null: no tenant buckets)
    tenant_burst: float | None = None
    input_cost: float = 1.0  # a request's cost: input_cost x prompt + output_cost x output
    output_cost: float = 0.0
    overload_queue_depth: float = 8.0  # tier_shedding: queued requests per replica

    def __post_init__(self) -> None:
        if self.type not in ADMISSIONS:
            raise ConfigError(
                f"gateway.admission.type must be one of {ADMISSIONS}, got {self.type!r}"
            )
        for key in ("rate", "burst", "tenant_rate", "tenant_burst"):
            _number(f"admission.{key}", getattr(self, key), 0, strict=True, optional=True)
        for key in ("input_cost", "output_cost"):
            _number(f"admission.{key}", getattr(self, key), 0, strict=False)
        _number("admission.overload_queue_depth", self.overload_queue_depth, 0, strict=True)
        if self.type == "token_bucket" and self.rate is None and self.tenant_rate is None:
            raise ConfigError(
                "gateway.admission.type=token_bucket needs gateway.admission.rate (a global "
                "bucket) or gateway.admission.tenant_rate (one per tenant), in cost units a second"
            )
        if self.input_cost == 0 and self.output_cost == 0:
            raise ConfigError(
                "gateway.admission.input_cost and output_cost are both 0: give one > 0"
            )


@dataclass(frozen=True)
class FlowControlConfig:
    enabled: bool = False
    fairness: str = "round_robin"  # across a band's tenants: one of FAIRNESS
    queue_bound: int | None = None  # requests the gateway may hold (null: no bound)
    ttl: float | None = None  # seconds a request may wait at the gateway (null: no limit)
    fairness_args: Mapping[str, Any] | None = None  # the policy's settings

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(
                f"gateway.flow_control.enabled must be true or false, got {self.enabled!r}"
            )
        if self.fairness not in FAIRNESS:
            raise ConfigError(
                f"gateway.flow_control.fairness must be one of {FAIRNESS}, got {self.fairness!r}"
            )
        b = self.queue_bound
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ConfigError(
                f"gateway.flow_control.queue_bound must be an integer >= 1 or null, got {b!r}"
            )
        _number("flow_control.ttl", self.ttl, 0, strict=True, optional=True)


def _block(cls: type, value: object, key: str) -> Any:
    """A sub-block given as a mapping, checked for unknown keys."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"gateway.{key} must be a mapping of settings, got {value!r}")
    accepted = sorted(f.name for f in fields(cls))
    unknown = sorted(set(value) - set(accepted))
    if unknown:
        raise ConfigError(f"gateway.{key}: unknown key(s) {unknown}; accepted: {accepted}")
    return cls(**value)


@dataclass(frozen=True)
class GatewayConfig:
    """`gateway:`. Classes label requests (per client; a trace's own `slo_class` column wins);
    the gateway acts only when admission is not `always` or flow control is on (`active`)."""

    classes: Mapping[str, str] | None = None  # client -> SLO class
    default_class: str = "standard"
    admission: AdmissionConfig | Mapping[str, Any] = field(default_factory=AdmissionConfig)
    flow_control: FlowControlConfig | Mapping[str, Any] = field(default_factory=FlowControlConfig)
    saturation: SaturationConfig | Mapping[str, Any] = field(default_factory=SaturationConfig)
    # the flow-control fairness policy, built by the caller from `flow_control.fairness`
    # (simulator/api/run.py: engines do not import concrete policies)
    fairness_policy: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.classes is None:
            object.__setattr__(self, "classes", {})
        if not isinstance(self.classes, Mapping):
            raise ConfigError(
                f"gateway.classes must map client names to classes, got {self.classes!r}"
            )
        for name, value in {**self.classes, "default_class": self.default_class}.items():
            if value not in SLO_CLASSES:
                where = "default_class" if name == "default_class" else f"classes.{name}"
                raise ConfigError(f"gateway.{where} must be one of {SLO_CLASSES}, got {value!r}")
        object.__setattr__(self, "admission", _block(AdmissionConfig, self.admission, "admission"))
        flow = _block(FlowControlConfig, self.flow_control, "flow_control")
        object.__setattr__(self, "flow_control", flow)
        object.__setattr__(
            self, "saturation", _block(SaturationConfig, self.saturation, "saturation")
        )

    @property
    def active(self) -> bool:
        """The gateway decides something (otherwise requests go straight to the dispatcher)."""
        assert isinstance(self.admission, AdmissionConfig)
        assert isinstance(self.flow_control, FlowControlConfig)
        return self.admission.type != "always" or self.flow_control.enabled

    def labels(self, trace: Trace) -> bool:
        """Whether the run's requests carry SLO classes (named here, in the trace, or needed by
        an active gateway): otherwise nothing about them changes."""
        named = bool(self.classes) or self.default_class != "standard"
        return named or trace.slo_class is not None or self.active

    def class_codes(self, trace: Trace) -> np.ndarray:
        """Each request's SLO class (codes into SLO_CLASSES): the trace's, else its client's."""
        if trace.slo_class is not None:
            return trace.slo_class
        classes = self.classes or {}
        unknown = sorted(set(classes) - set(trace.client_names))
        if unknown:
            raise ConfigError(
                f"gateway.classes: unknown client {unknown[0]!r}; clients are "
                f"{list(trace.client_names)}"
            )
        named = [classes.get(c, self.default_class) for c in trace.client_names]
        per_client = np.array([SLO_CLASSES.index(c) for c in named], dtype=np.int8)
        return per_client[trace.client]


class TokenBucket:
    """`rate` units a second into a bucket `depth` deep, full at time 0."""

    def __init__(self, rate: float, depth: float) -> None:
        self.rate, self.depth = rate, depth
        self.level, self.at = depth, 0.0

    def refill(self, now: float) -> float:
        self.level = min(self.depth, self.level + self.rate * (now - self.at))
        self.at = now
        return self.level


@dataclass
class Band:
    """One priority band of flow control: a lane per tenant and the fairness policy's copy."""

    priority: int
    queue: WaitingQueue
    policy: Policy


Send = Callable[[int, float], None]  # route a request to a replica now
Reject = Callable[[int, float, str], None]


class Gateway:
    """The gateway of one run: `arrive` on each arrival, `pump` whenever the pool may have
    room (after every step), `ended` when a dispatched request ends."""

    def __init__(
        self,
        cfg: GatewayConfig,
        trace: Trace,
        client_of: list[int],
        deadline: Callable[[int], float] = lambda req: math.inf,
    ) -> None:
        assert isinstance(cfg.admission, AdmissionConfig)
        assert isinstance(cfg.flow_control, FlowControlConfig)
        assert isinstance(cfg.saturation, SaturationConfig)
        self.cfg, self.trace = cfg, trace
        self.admission, self.flow, self.saturation = cfg.admission, cfg.flow_control, cfg.saturation
        self.slo_class = cfg.class_codes(trace)
        priorities = np.array([SLO_PRIORITY[c] for c in SLO_CLASSES])
        self.priority = priorities[self.slo_class]
        a = self.admission
        self.cost = a.input_cost * trace.prompt_len + a.output_cost * trace.output_len
        self.bucket = None if a.rate is None else TokenBucket(a.rate, a.burst or a.rate)
        self.tenant_buckets: dict[int, TokenBucket] = {}
        self.bands: dict[int, Band] = {}
        self.client_of = client_of
        self.queued = 0
        # (when, request, reason) while it waits: its TTL, or its client giving up
        self.expiries: list[tuple[float, int, str]] = []
        self.deadline = deadline  # when a request's client gives up (inf: never)
        self.dispatched_at = np.full(len(trace), np.nan)
        # KV in use on a replica as of an instant: after its last step (the runner's reading
        # when a run of decode steps may be under way then)
        self.kv_now: Callable[[StepModel, float], int] = lambda rep, now: rep.steps.last_kv
        if self.flow.enabled:
            policy = cfg.fairness_policy
            if policy is None:
                raise ConfigError(
                    f"gateway.flow_control.fairness={self.flow.fairness}: no policy object was "
                    "built for it (build the gateway config with simulator.api)"
                )
            self.template: Policy = policy

    # ---- admission ------------------------------------------------------------------------
    def arrive(self, req: int, now: float, replicas: list[StepModel]) -> str | None:
        """A request reaches the gateway: a rejection reason, or None (queued with flow
        control on; otherwise to be routed at once)."""
        reason = self._admission(req, now, replicas)
        if reason is not None or not self.flow.enabled:
            return reason
        if self.flow.queue_bound is not None and self.queued >= self.flow.queue_bound:
            return QUEUE_FULL
        band = self._band(int(self.priority[req]))
        reason = band.policy.on_arrival(req, now, band.queue)
        if reason is not None:
            return reason
        band.queue.push(req)
        self.queued += 1
        ttl = math.inf if self.flow.ttl is None else now + self.flow.ttl
        gone = self.deadline(req)
        if min(ttl, gone) < math.inf:
            heapq.heappush(
                self.expiries,
                (ttl, req, TTL_EXPIRED) if ttl <= gone else (gone, req, CLIENT_TIMEOUT),
            )
        return None

    def _admission(self, req: int, now: float, replicas: list[StepModel]) -> str | None:
        kind = self.admission.type
        if kind == "token_bucket":
            return self._take_tokens(req, now)
        if kind == "saturation":
            if self.priority[req] < 0 and self.saturated(replicas, now):
                return SATURATED
            return None
        if kind == "tier_shedding":
            name = SLO_CLASSES[int(self.slo_class[req])]
            if name in SHED_ORDER:
                waiting = sum(len(rep.queue) for rep in self._distinct(replicas)) + self.queued
                depth = waiting / len(replicas)
                if depth >= (SHED_ORDER.index(name) + 1) * self.admission.overload_queue_depth:
                    return TIER_SHED
        return None

    def _take_tokens(self, req: int, now: float) -> str | None:
        a, cost = self.admission, float(self.cost[req])
        buckets = [] if self.bucket is None else [self.bucket]
        if a.tenant_rate is not None:
            c = self.client_of[req]
            if c not in self.tenant_buckets:
                self.tenant_buckets[c] = TokenBucket(a.tenant_rate, a.tenant_burst or a.tenant_rate)
            buckets.append(self.tenant_buckets[c])
        if any(b.refill(now) < cost for b in buckets):
            return RATE_LIMITED
        for b in buckets:
            b.level -= cost
        return None

    @staticmethod
    def _distinct(replicas: list[StepModel]) -> list[StepModel]:
        """The replicas with distinct queues (a shared queue counted once)."""
        seen: dict[int, StepModel] = {}
        for rep in replicas:
            seen.setdefault(id(rep.queue), rep)
        return list(seen.values())

    def saturated(self, replicas: list[StepModel], now: float) -> bool:
        """No replica has room at `now` (fewer waiting than the queue depth and KV use under
        the threshold after its last step)."""
        s, kv_now = self.saturation, self.kv_now
        return not any(
            len(rep.queue) < s.queue_depth and kv_now(rep, now) < s.kv_utilization * rep.pool_tokens
            for rep in replicas
        )

    # ---- flow control -----------------------------------------------------------------------
    def _band(self, priority: int) -> Band:
        band = self.bands.get(priority)
        if band is None:
            policy = copy.deepcopy(self.template)
            policy.bind(self.trace)
            if isinstance(policy, CounterPolicy):  # its counters decide; nothing reads the log
                policy.counter_log().discard()
            band = self.bands[priority] = Band(priority, WaitingQueue(self.client_of), policy)
        return band

    def next_expiry(self) -> float:
        """When the next waiting request's TTL runs out or its client gives up (inf: none)."""
        while self.expiries and not self._waiting(self.expiries[0][1]):
            heapq.heappop(self.expiries)
        return self.expiries[0][0] if self.expiries else math.inf

    def _waiting(self, req: int) -> bool:
        return req in self.bands[int(self.priority[req])].queue

    def pump(self, now: float, replicas: list[StepModel], send: Send, reject: Reject) -> None:
        """Expire what waited too long, then dispatch while the pool has room: the highest band
        with a request its policy admits, that request."""
        while self.expiries and self.expiries[0][0] <= now:
            _, req, reason = heapq.heappop(self.expiries)
            if self._waiting(req):
                self._leave(req)
                reject(req, now, reason)
        while self.queued and not self.saturated(replicas, now):
            picked = self._next(now, reject)
            if picked is None:
                return
            req = picked
            self._leave(req)
            self.dispatched_at[req] = now
            policy = self.bands[int(self.priority[req])].policy
            if PromptTokens in policy.charged:
                policy.charge(PromptTokens(req, int(self.trace.prompt_len[req]), now))
            send(req, now)

    def _next(self, now: float, reject: Reject) -> int | None:
        for priority in sorted(self.bands, reverse=True):
            band = self.bands[priority]
            while len(band.queue):
                req = band.policy.pick(band.queue, now)
                if req is None:
                    break
                verdict = band.policy.admit(req, now, True)
                if verdict is ADMIT:
                    return req
                if isinstance(verdict, Drop):
                    self._leave(req)
                    reject(req, now, verdict.reason)
                    continue
                break  # WAIT: this band holds; a lower one may go
        return None

    def _leave(self, req: int) -> None:
        self.bands[int(self.priority[req])].queue.remove(req)
        self.queued -= 1

    def ended(self, req: int, now: float, generated: int, completed: bool) -> None:
        """A dispatched request ended (`completed`: with its last token): its output passed
        the gateway (charged now)."""
        if not self.flow.enabled or math.isnan(self.dispatched_at[req]):
            return
        policy = self.bands[int(self.priority[req])].policy
        if OutputTokens in policy.charged and generated > 0:  # every token passed the gateway
            client = np.array([self.client_of[req]])
            steps = np.full(generated, now)
            policy.charge(OutputTokens(np.array([req]), client, steps, with_first=True))
        if completed and Finished in policy.charged:
            policy.charge(Finished(req, now))
        elif not completed and Left in policy.charged:
            policy.charge(Left(req, now, generated))

    def request_columns(self) -> dict[str, np.ndarray]:
        return {"gateway_dispatched_at": self.dispatched_at} if self.flow.enabled else {}
