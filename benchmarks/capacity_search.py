"""Capacity-search benchmark (target: an Etalon-mode search of 20 probes over 2,000-request
runs in <= 30 s on a 2-core x86 VM with 24 GB).

Uses `conf/capacity.yaml` as shipped (poisson_chat workload, the root config's policy (VTC),
A10G cost model, D_d = 30 ms, D_p = profiled prefill + 0.3 s, P99 miss rate <= 0.1).
1. The real Etalon search, as `fairsim-capacity` runs it (it converges in fewer than 20 probes).
2. Exactly 20 probes at rates spread over 0.5x ... 1.5x the capacity found, each a full
   2,000-request run scored for the SLO: the figure the target is about.
3. Baseline in the same process: the same 20 runs without scoring (simulation only), so the
   ratio shows what the fluidity scoring costs.
Prints one JSON object last.

Usage: python benchmarks/capacity_search.py
"""

from __future__ import annotations

import json
import time

import numpy as np

from simulator.api import compose_config
from simulator.apps.capacity.cli import SimulatedService
from simulator.apps.capacity.searches import etalon_search


def main() -> None:
    cfg = compose_config(config_name="capacity")
    t0 = time.perf_counter()
    service = SimulatedService(cfg)
    setup = time.perf_counter() - t0

    t0 = time.perf_counter()
    result = etalon_search(service.check_slos, float(cfg.capacity.start))
    search = time.perf_counter() - t0
    best = result.best_value or float(cfg.capacity.start)

    rates = np.round(np.linspace(0.5 * best, 1.5 * best, 20), 3)
    t0 = time.perf_counter()
    passed = [service.check_slos(float(r))[0] for r in rates]
    twenty = time.perf_counter() - t0

    t0 = time.perf_counter()
    for r in rates:
        service.run(float(r), int(cfg.seed))
    simulate_only = time.perf_counter() - t0

    print(
        f"setup (configs, prefill profile): {setup:.2f} s\n"
        f"etalon search: {len(result.history)} probes, best {result.best_value} req/s, "
        f"{search:.2f} s\n"
        f"20 scored probes at {rates[0]}..{rates[-1]} req/s ({sum(passed)} pass): {twenty:.2f} s "
        f"(target <= 30 s)\n"
        f"same 20 runs, simulation only: {simulate_only:.2f} s "
        f"(scoring adds {twenty / simulate_only:.2f}x)"
    )
    print(
        json.dumps(
            {
                "search_probes": len(result.history),
                "search_best_rate": result.best_value,
                "search_s": round(search, 3),
                "twenty_probes_s": round(twenty, 3),
                "simulate_only_s": round(simulate_only, 3),
                "scoring_ratio": round(twenty / simulate_only, 3),
                "requests_per_probe": int(cfg.capacity.num_requests),
            }
        )
    )


if __name__ == "__main__":
    main()
