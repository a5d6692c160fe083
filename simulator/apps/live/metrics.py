"""`fairsim-serve`'s Prometheus metrics: vLLM's names for what fairsim models (requests running
and waiting, KV use, preemptions, prompt and generated tokens, TTFT / inter-token / end-to-end
latency histograms in simulated seconds) and `fairsim:client_service`, the active policy's
counter per client."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from simulator.core.seam import CounterPolicy
from simulator.engines.live import LiveSession

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    """vLLM's metric names for what fairsim models, plus the policy's per-client counters.
    Latencies are simulated seconds."""

    def __init__(self, registry: CollectorRegistry, model: str, session: LiveSession) -> None:
        self.session, self._preempted = session, 0
        label = {"model_name": model}
        names = ["model_name"]
        self.label = label
        self.running = Gauge(
            "vllm:num_requests_running", "Requests running", names, registry=registry
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting", names, registry=registry
        )
        self.kv = Gauge(
            "vllm:kv_cache_usage_perc", "KV cache in use (0-1)", names, registry=registry
        )
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions", names, registry=registry)
        self.prompt = Counter(
            "vllm:prompt_tokens", "Prompt tokens of served requests", names, registry=registry
        )
        self.generation = Counter(
            "vllm:generation_tokens", "Tokens generated", names, registry=registry
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "TTFT",
            names,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Inter-token latency",
            names,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end latency",
            names,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.service = Gauge(
            "fairsim:client_service",
            "The policy's counter per client",
            ["model_name", "client"],
            registry=registry,
        )

    def record(self, row: int, prompt_tokens: int, sim_times: list[float]) -> None:
        """A request's answer is over: its tokens' simulated times."""
        if not sim_times:
            return
        arrival = float(self.session.runner.state.arrival[row])
        times = np.asarray(sim_times)
        self.prompt.labels(**self.label).inc(prompt_tokens)
        self.generation.labels(**self.label).inc(times.shape[0])
        self.ttft.labels(**self.label).observe(times[0] - arrival)
        for gap in np.diff(times).tolist():
            self.itl.labels(**self.label).observe(gap)
        self.e2e.labels(**self.label).observe(times[-1] - arrival)

    def refresh(self, waiting: int, clients: dict[str, int]) -> None:
        """The gauges and counters read from the session, before a scrape."""
        runner = self.session.runner
        running = sum(len(rep.running) for rep in runner.replicas)  # type: ignore[attr-defined,misc]
        kv = sum(rep.kv_used() for rep in runner.replicas)
        pool = sum(rep.pool_tokens for rep in runner.replicas)
        self.running.labels(**self.label).set(running)
        self.waiting.labels(**self.label).set(waiting)
        self.kv.labels(**self.label).set(kv / pool if pool else 0.0)
        preempted = sum(int(np.sum(rep.steps.columns()["preempted"])) for rep in runner.replicas)
        self.preemptions.labels(**self.label).inc(preempted - self._preempted)
        self._preempted = preempted
        policy = runner.policies[0]
        counter = getattr(policy, "counter", None)
        if isinstance(policy, CounterPolicy) and counter is not None:
            for name, slot in clients.items():
                self.service.labels(client=name, **self.label).set(float(counter[slot]))
