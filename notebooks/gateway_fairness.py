# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Fairness in the engine, at the gateway, or both — on a fixed fleet and an autoscaled one
#
# One multi-tenant workload on a compressed day (`experiment=gateway_fairness`: a heavy tenant
# sending as much as three light ones together, and an interactive tenant of class `critical`;
# every rate follows the day, busiest at 600 s), vLLM-style replicas behind `least_requests`.
# Fairness is enforced by VTC in the engine (`policy=vtc`), by VTC flow control at the gateway
# (`gateway.flow_control.enabled=true`, priority bands: the critical tenant first), or both;
# each on three fixed replicas and on a fleet the autoscaler scales between 1 and 6 replicas on
# queue depth, new ones loading for 30-60 s. Compared: the service difference between tenants,
# P99 TTFT per class and per tenant, and GPU-seconds (`docs/gateway.md`).
#
# Full-scale command (needs the `notebooks` extra; do not commit the executed outputs):
# `jupytext --to ipynb --execute notebooks/gateway_fairness.py`

# %% tags=["parameters"]
SCALE = "full"

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from simulator.api import compose_config, simulate_config
from simulator.metrics import fairness
from simulator.metrics.replicas import fleet_summary

DURATION = {"ci": 240, "full": 1200}[SCALE]
BASE = ["experiment=gateway_fairness", f"workload.duration={DURATION}"]
WHERE = {
    "engine only": ["policy=vtc"],
    "gateway only": ["policy=fcfs", "gateway.flow_control.enabled=true"],
    "both": ["policy=vtc", "gateway.flow_control.enabled=true"],
}
FLEETS = {"3 fixed": [], "autoscaled 1-6": ["cluster.autoscaler.enabled=true"]}


def run(overrides):
    return simulate_config(compose_config([*BASE, *overrides]))


runs = {(w, f): run([*WHERE[w], *FLEETS[f]]) for w in WHERE for f in FLEETS}

# %% [markdown]
# ## The table
# Max Diff: the largest gap in service rate between backlogged tenants (tokens/s, the VTC
# paper's table form); P99 TTFT per class; GPU-seconds held (a fixed fleet holds its replicas
# for the whole run).


# %%
def row(timeline):
    r, t = timeline.requests_frame(), timeline.tokens_frame()
    ttft = r.first_token_at - r.arrival
    stats = fairness.difference_stats(
        fairness.service_difference(fairness.served_intervals(r, t), "revision", DURATION)
    )
    fleet = timeline.info.get("fleet")
    gpu = fleet["gpu_seconds"] if fleet else 3 * timeline.info["end_time"]
    per_class = ttft.groupby(r.slo_class, observed=True).quantile(0.99)
    return {
        "Max Diff (tok/s)": stats["max_diff"],
        "P99 TTFT critical (s)": per_class.get("critical"),
        "P99 TTFT standard (s)": per_class.get("standard"),
        "GPU-seconds": gpu,
    }


table = pd.DataFrame({f"{w}, {f}": row(tl) for (w, f), tl in runs.items()}).T
print(table.round(2).to_string())

# %% [markdown]
# ## Mean TTFT per tenant
# VTC in the engine serves the light tenants first on each replica; at the gateway it picks
# the tenant of the smallest counter whenever the pool has room, and puts the critical tenant's
# band first. The autoscaler buys latency for everyone with GPU-seconds.

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), sharey=True)
width = 0.8 / len(WHERE)
for ax, fleet in zip(axes, FLEETS, strict=True):
    for k, where in enumerate(WHERE):
        r = runs[(where, fleet)].requests_frame()
        per = (r.first_token_at - r.arrival).groupby(r.client, observed=True).mean()
        x = np.arange(len(per)) + (k - (len(WHERE) - 1) / 2) * width
        ax.bar(x, per.to_numpy(), width, label=where)
    ax.set_xticks(np.arange(len(per)), list(per.index), rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_title(fleet)
axes[0].set_ylabel("mean TTFT (s, log scale)")
axes[0].legend(title="VTC in")
fig.suptitle("gateway_fairness: per-tenant TTFT")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Replicas over the day
# The autoscaler follows the queue: replicas are added as the queue builds (each loading 30-60 s
# before it serves) and drained once it has stayed short for the scale-down window (120 s).
# Scaling on queue depth flaps: a queue emptied by six replicas asks for one, and the next
# build-up for six again — the reason real deployments scale on KV use or in-flight tokens.

# %%
fig, ax = plt.subplots(figsize=(8, 3.4))
for where in WHERE:
    timeline = runs[(where, "autoscaled 1-6")]
    fleet = fleet_summary(timeline.info["fleet"], timeline.requests_frame())
    rows = np.array(fleet["replicas_over_time"], dtype=float)  # [time, ready, loading, draining]
    ax.step(rows[:, 0], rows[:, 1], where="post", label=where)
ax.set_xlabel("simulated time (s)")
ax.set_ylabel("replicas ready")
ax.legend(title="VTC in", loc="upper left", fontsize=8)
arrivals = runs[("both", "3 fixed")].trace.arrival  # the same requests in every run
rate_ax = ax.twinx()
counts, edges = np.histogram(arrivals, bins=np.arange(0, DURATION + 30, 30))
rate_ax.step(edges[:-1], counts / 30, where="post", color="0.6", linestyle=":")
rate_ax.set_ylabel("arrivals (requests/s, dotted)", color="0.4")
ax.set_title("gateway_fairness: replicas ready under the autoscaler (queue depth, target 4)")
plt.tight_layout()
plt.show()
