"""Metrics: pure functions of a run's tables (requests, tokens, steps), never of the engine.

`latency` (TTFT, TBT, TPOT, E2E, throughput, goodput, Andes QoE, KV use), `fluidity` (Etalon's
fluidity-index, deadline misses, fluid token rate), `fairness` (the VTC paper's service
difference), `interactions` (FairServe's throttling and waste), `replicas` (preemptions, prefix
hits, per replica), `qoe` and `slo` (the run's QoE summary and SLO results), `prefill_curve`.
Every formula is in docs/metrics.md.
"""

from simulator.metrics.fluidity import fluidity_index

__all__ = ["fluidity_index"]
