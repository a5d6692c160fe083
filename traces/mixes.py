"""Built-in tenant mixes that need no downloaded data: synthetic approximations of published
workloads, built as ordinary `SyntheticWorkload`s.

- `arena_like`: the VTC paper's real workload (Chatbot Arena, 27 clients) from its published
  facts (its section 5 and the trace in its artifact): the per-client request counts of the
  stored trace as shares,
  Poisson arrivals, log-normal lengths with the trace's medians (prompt 40, output 211) and sigmas
  fitted so that the means after the cap at 1,023 tokens (the paper dropped >= 1,024) are the
  trace's (prompt 136, output 256): sigma 1.782 and 0.632.
- `servegen_like`: a ServeGen-style client pool: Pareto-distributed client rates (a few clients
  carry most requests), bursty Gamma arrivals with per-client CVs, and per-client log-normal
  lengths; drawn once from `pool_seed`, so the pool is fixed while the run's seed varies.
"""

from __future__ import annotations

import numpy as np

from traces.arrivals import Gamma, Poisson
from traces.lengths import LogNormal
from traces.schema import TraceError
from traces.synthetic import ClientSpec, SyntheticWorkload

# requests per client in the VTC artifact's stored real trace (1,500 requests in 600 s)
ARENA_COUNTS = (296, 262, 199, 120, 67, 66, 56, 46, 44, 43, 40, 36, 31, 26, 25, 23, 22, 22, 19,
                19, 12, 11, 7, 3, 2, 2, 1)  # fmt: skip


def arena_like(total_rate: float = 2.5, duration: float = 600.0) -> SyntheticWorkload:
    """27 clients sharing `total_rate` requests/s like the VTC real trace (2.5/s there)."""
    shares = np.array(ARENA_COUNTS, dtype=float) / sum(ARENA_COUNTS)
    prompt = LogNormal(median=40, sigma=1.782, max_value=1023)
    output = LogNormal(median=211, sigma=0.632, max_value=1023)
    clients = [
        ClientSpec(f"arena{i:02d}", Poisson(total_rate * s), prompt, output)
        for i, s in enumerate(shares)
    ]
    return SyntheticWorkload(clients, duration, name="arena_like")


def servegen_like(
    num_clients: int = 40,
    total_rate: float = 5.0,
    duration: float = 600.0,
    alpha: float = 1.2,
    pool_seed: int = 0,
) -> SyntheticWorkload:
    """`num_clients` clients whose rates follow a Pareto(alpha) law scaled to `total_rate`;
    inter-arrival CV log-uniform in [0.7, 4], prompt medians log-uniform in [100, 3000]
    (sigma 1), output medians in [30, 400] (sigma 0.8)."""
    if int(num_clients) != num_clients or num_clients < 1:
        raise TraceError(f"servegen_like: num_clients must be >= 1, got {num_clients}")
    if not (total_rate > 0 and duration > 0 and alpha > 0):
        raise TraceError("servegen_like: total_rate, duration and alpha must be > 0")
    rng = np.random.default_rng(pool_seed)
    weights = np.sort(rng.pareto(alpha, num_clients) + 1.0)[::-1]
    rates = total_rate * weights / weights.sum()
    cvs = np.exp(rng.uniform(np.log(0.7), np.log(4.0), num_clients))
    p_med = np.exp(rng.uniform(np.log(100), np.log(3000), num_clients))
    o_med = np.exp(rng.uniform(np.log(30), np.log(400), num_clients))
    clients = [
        ClientSpec(
            f"client{i:02d}",
            Gamma(float(rates[i]), float(cvs[i])),
            LogNormal(float(p_med[i]), 1.0, max_value=16384),
            LogNormal(float(o_med[i]), 0.8, max_value=4096),
        )
        for i in range(num_clients)
    ]
    return SyntheticWorkload(clients, duration, name="servegen_like")
