# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Co-located replicas, prefill/decode pools, and a CPU tier for KV, for several tenants
#
# One multi-tenant workload (`experiment=pd_prefix_tenants`: clients with long shared system
# prompts and multi-turn conversations beside clients whose long prompts share nothing) served
# by Llama-2-70B on H100 (tensor parallel 4, the fitted cost model) under VTC, three ways on
# the same requests: two co-located replicas sharing one set of counters (`global_vtc`), one
# prefill and one decode replica with one set of counters charged by both pools, and the same
# pools with a CPU tier for KV. Then, for each layout, the fewest replicas that keep P90 TTFT
# and P90 TPOT within their SLOs (`docs/disaggregation.md` says how the pools work).
#
# Full-scale command (needs the `notebooks` extra; do not commit the executed outputs):
# `jupytext --to ipynb --execute notebooks/disaggregation.py`

# %% tags=["parameters"]
SCALE = "full"

# %%
import matplotlib.pyplot as plt
import numpy as np

from simulator.api import compose_config, simulate_config
from simulator.metrics import fairness

DURATION = {"ci": 30, "full": 120}[SCALE]
BASE = ["experiment=pd_prefix_tenants", f"workload.duration={DURATION}"]
CO_LOCATED = ["cluster.prefill_replicas=0", "cluster.decode_replicas=0"]
LAYOUTS = {
    "co-located x2": [*CO_LOCATED, "cluster.replicas=2", "cluster.dispatcher=global_vtc"],
    "1P+1D": [],
    "1P+1D, CPU tier": ["engine.cpu_kv_tokens=400000"],
}


def run(overrides):
    timeline = simulate_config(compose_config([*BASE, *overrides]))
    return timeline.requests_frame(), timeline.tokens_frame()


runs = {name: run(overrides) for name, overrides in LAYOUTS.items()}
requests = runs["1P+1D"][0]
print({name: r.status.value_counts().to_dict() for name, (r, _) in runs.items()})

# %% [markdown]
# ## TTFT and TPOT per tenant
# TTFT counts from the send to the first token (under P/D: the prefill replica's last step);
# TPOT is the mean time per output token after the first (under P/D it includes the KV
# transfer and the wait for a decode slot).

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
width = 0.8 / len(runs)
for k, (name, (r, _)) in enumerate(runs.items()):
    done = r[r.status == "completed"]
    per = done.assign(
        ttft=done.first_token_at - done.arrival,
        tpot=(done.finished_at - done.first_token_at) / (done.output_len - 1).clip(lower=1),
    ).groupby("client", observed=True)
    clients = list(per.groups)
    x = np.arange(len(clients)) + (k - (len(runs) - 1) / 2) * width
    axes[0].bar(x, per.ttft.mean().to_numpy(), width, label=name)
    axes[1].bar(x, 1000 * per.tpot.mean().to_numpy(), width, label=name)
for ax, unit in zip(axes, ("mean TTFT (s)", "mean TPOT (ms)"), strict=True):
    ax.set_xticks(np.arange(len(clients)), clients, rotation=45, ha="right")
    ax.set_ylabel(unit)
axes[0].legend()
fig.suptitle("pd_prefix_tenants: Llama-2-70B on H100 x4 per replica, VTC")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Service difference between tenants over time
# The largest gap in accumulated service (w_p = 1, w_q = 2) between any two clients. At this
# load no tenant waits long, so service follows demand: the clients whose long prompts share
# nothing ask for more, and the gap grows with time in every layout; what differs is how the
# layouts time each tenant's service.

# %%
fig, ax = plt.subplots(figsize=(7, 3.2))
times = np.linspace(0, DURATION, 200)
for name, (r, t) in runs.items():
    gap = fairness.accumulated_difference(fairness.served_intervals(r, t), times)
    ax.plot(times, gap.to_numpy(), label=name)
ax.set_xlabel("time (s)")
ax.set_ylabel("max - min accumulated service (tokens)")
ax.legend()
plt.show()

# %% [markdown]
# ## Replicas (of 4 GPUs) needed for the same SLOs
# At three times the rate above (`workload.rate=3`), the fewest replicas for which P90 TTFT
# <= 1 s and P90 TPOT <= 50 ms, co-located, or with the best split into prefill and decode
# pools (with and without the CPU tier).

# %%
SLO_TTFT, SLO_TPOT, RATE = 1.0, 0.05, 3


def meets(overrides):
    r, _ = run([f"workload.rate={RATE}", *overrides])
    done = r[r.status == "completed"]
    if len(done) < len(r):
        return False
    ttft = done.first_token_at - done.arrival
    tpot = (done.finished_at - done.first_token_at) / (done.output_len - 1).clip(lower=1)
    return ttft.quantile(0.9) <= SLO_TTFT and tpot.quantile(0.9) <= SLO_TPOT


def layouts(kind, n):
    """Every way to lay out n replicas of this kind."""
    if kind == "co-located":
        return [[*CO_LOCATED, f"cluster.replicas={n}", "cluster.dispatcher=global_vtc"]]
    tier = ["engine.cpu_kv_tokens=400000"] if kind == "P/D, CPU tier" else []
    return [
        [f"cluster.prefill_replicas={p}", f"cluster.decode_replicas={n - p}", *tier]
        for p in range(1, n)
    ]


needed = {}
for kind in ("co-located", "P/D", "P/D, CPU tier"):
    needed[kind] = next((n for n in range(2, 7) if any(meets(o) for o in layouts(kind, n))), None)
print({kind: f"{n} replicas, {4 * n} GPUs" if n else "more than 6" for kind, n in needed.items()})
