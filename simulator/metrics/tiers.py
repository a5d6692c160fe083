"""Per SLO class (tier) and per tenant: what the gateway turned away, the latency each tier got,
and fairness between the tenants of each tier (docs/metrics.md, "Fairness at the gateway").

Pure functions of the requests table of a run whose requests carry an `slo_class` column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.metrics.fairness import fairness_summary
from simulator.metrics.latency import percentile


def tier_summary(
    requests: pd.DataFrame, last_tokens: pd.DataFrame | None, total: float
) -> dict[str, object]:
    """{tiers: {class: counts, TTFT mean/p99 (s), fairness between its tenants},
    tenants: {client: {class: rejected by reason}}}: each class present in the run."""
    tiers: dict[str, object] = {}
    for name, rows in requests.groupby("slo_class", observed=True, sort=True):
        ttft = (rows["first_token_at"] - rows["arrival"]).to_numpy(dtype=float)
        lost = rows[rows["status"].isin(["rejected", "refused"])]
        entry: dict[str, object] = {
            "requests": len(rows),
            "completed": int((rows["status"] == "completed").sum()),
            "rejected": lost.groupby("reason", observed=True).size().astype(int).to_dict(),
            "ttft_mean_s": float(np.nanmean(ttft)) if np.isfinite(ttft).any() else None,
            "ttft_p99_s": percentile(ttft, 99),
        }
        served = rows[rows["first_token_at"].notna()]
        if served["client"].nunique() > 1:
            fair = fairness_summary(rows, _tokens_of(last_tokens, rows), total=total)
            entry["fairness"] = {
                k: fair[k] for k in ("max_diff", "avg_diff", "diff_var", "jain_index")
            }
        tiers[str(name)] = entry
    lost = requests[requests["status"].isin(["rejected", "refused"])]
    tenants: dict[str, dict[str, dict[str, int]]] = {}
    counts = lost.groupby(["client", "slo_class", "reason"], observed=True).size()
    for (client, tier, reason), n in counts.items():
        tenants.setdefault(str(client), {}).setdefault(str(tier), {})[str(reason)] = int(n)
    return {"tiers": tiers, "rejected_per_tenant": tenants}


def _tokens_of(last_tokens: pd.DataFrame | None, rows: pd.DataFrame) -> pd.DataFrame | None:
    if last_tokens is None:
        return None
    return last_tokens[last_tokens["request_id"].isin(rows["request_id"])]
