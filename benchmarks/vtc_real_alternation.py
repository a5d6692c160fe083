"""How unequally 60 s windows find the real trace's two heaviest clients under VTC (Table 3's
VTC row: profiled charges), in the artifact's log and in fairsim's replications.

From about 250 s on, clients rank-8-2 and rank-8-10 are both backlogged and VTC serves them in
alternating runs of admissions. Table 3's Max Diff, Avg Diff and Diff Var are mostly these two
clients' gap as the scoring windows see it, so all three follow one quantity: over the last ten
windows, the mean of |s_2 - s_10| / (s_2 + s_10) (s: a client's service rate in the window,
profiled cost). This prints it for the artifact's log (tests/data/vtc_artifact) and for each
of the report's replications, beside the row's three figures, and the log's most unequal
window. Prints one JSON object last.

Usage: python benchmarks/vtc_real_alternation.py [--logs DIR] [--replications 20]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.api import compose_config, simulate_config
from simulator.apps.papers.vtc_tables import ARTIFACT_RUN_SPEED_CV, ROWS, artifact_log_requests
from simulator.apps.sweeps.replications import paper_replication
from simulator.core.service import ProfiledService
from simulator.metrics.fairness import (
    difference_stats,
    paper_ticks,
    served_intervals,
    service_difference,
    service_rates,
)

HEAVY = ("dummy-lora-7b-rank-8-2", "dummy-lora-7b-rank-8-10")
LAST = 10  # windows: the contended second half of the run
TICKS = paper_ticks(600.0, 20, 30.0)


def scored(requests: pd.DataFrame, tokens: pd.DataFrame | None = None) -> dict[str, float]:
    intervals = served_intervals(requests, tokens, ProfiledService())
    rates = service_rates(intervals, TICKS, 60.0, 30.0)[list(HEAVY)].to_numpy()[-LAST:]
    gap = np.abs(rates[:, 0] - rates[:, 1]) / (rates[:, 0] + rates[:, 1])
    figures = difference_stats(service_difference(intervals, "revision", 600.0))
    rounded = {key: round(value, 2) for key, value in figures.items()}
    return {"alternation": round(float(gap.mean()), 3), **rounded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", default="tests/data/vtc_artifact")
    parser.add_argument("--replications", type=int, default=20)
    args = parser.parse_args()
    row = next(r for r in ROWS if r.table == "3" and r.label == "VTC")
    log, _ = artifact_log_requests(Path(args.logs, "VTC_profile", "all_results_real.jsonl.gz"))
    rates = service_rates(served_intervals(log, None, ProfiledService()), TICKS, 60.0, 30.0)
    widest = int(np.argmax(np.abs(rates[HEAVY[0]] - rates[HEAVY[1]]).to_numpy()))
    window = [round(float(TICKS[widest]), 1), round(float(TICKS[widest]) + 60.0, 1)]
    heavy = {c: round(float(rates[c].iloc[widest]), 1) for c in HEAVY}
    result = {"log": scored(log), "log_widest_window_s": window, "log_widest_window": heavy}
    print(f"log        {result['log']}   most unequal window {window} s: {heavy} tokens/s")
    cfg = compose_config(list(row.overrides))
    replications = []
    for i in range(args.replications):
        timeline = simulate_config(paper_replication(cfg, i, ARTIFACT_RUN_SPEED_CV))
        replications.append(scored(timeline.requests_frame(), timeline.tokens_frame()))
        print(f"rep {i:<5}  {replications[-1]}", flush=True)
    above = sum(r["alternation"] >= result["log"]["alternation"] for r in replications)
    print(f"replications at least as unequal as the log: {above} of {len(replications)}")
    print(json.dumps({**result, "replications": replications, "at_least_as_unequal": above}))


if __name__ == "__main__":
    main()
