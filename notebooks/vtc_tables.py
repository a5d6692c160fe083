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
# # VTC paper: Tables 2-6, the real trace (Figs. 12-14), weighted VTC (Fig. 16)
#
# Every row of Tables 2-6 measured next to the paper's numbers (`fairsim-vtc-tables` prints the
# same), the real 27-client trace under FCFS, VTC and RPM (RPM's throughput/fairness dilemma),
# and weighted VTC's 1:2:3:4 service split. Tables 2-3 and Figs. 12-14 replay the artifact's real
# trace, shipped with fairsim. Full scale: every row (`SCALE = "full"`, several minutes); CI: one
# row per table.
#
# Full-scale command (needs the `notebooks` extra; do not commit the executed outputs):
# `jupytext --to ipynb --execute notebooks/vtc_tables.py`

# %% tags=["parameters"]
SCALE = "full"

# %%
import matplotlib.pyplot as plt
import pandas as pd

from simulator.api import compose_config, simulate_config
from simulator.apps.papers.vtc_tables import ROWS, measure
from simulator.metrics import fairness

# %% [markdown]
# ## Tables 2-6: measured against published

# %%
rows = list(ROWS)
if SCALE == "ci":
    rows = [next(r for r in rows if r.table == t) for t in sorted({r.table for r in rows})]
records = []
for row in rows:
    m = measure(row)
    records.append(
        {
            "table": row.table,
            "scheduler": row.label,
            "Max Diff": m["max_diff"],
            "paper Max Diff": row.max_diff,
            "Avg Diff": m["avg_diff"],
            "paper Avg Diff": row.avg_diff,
            "tokens/s": m["throughput_tokens_per_s"],
            "paper tokens/s": row.throughput,
            "rejected": m["rejected"],
            "paper rejected": row.rejected,
        }
    )
pd.DataFrame(records).round(1)


# %% [markdown]
# ## The overload suite: VTC's service difference across replications
# VTC serves the two clients in alternating whole batches, and Table 5's Max Diff is that
# alternation seen through the scoring windows. Replications with step-time jitter alone (CV
# 0.02, jitter seed i) and with the workload seed varied as well (seed i) show how far step
# noise and the arrivals' phase move it: with the end-to-end cost fit every replication lands
# near 200-210 tokens (with the kernel-fit cost the phase split them into two regimes, near
# 20-35 and 205-240). The paper's single measured run (192.88) is one draw of such a process.
# `fairsim-validation` reports the same.

# %%
import numpy as np

N = {"ci": 4, "full": 20}[SCALE]
row = next(r for r in ROWS if r.table == "5" and r.label == "VTC")
jitter_only = [measure(row, replication=i)["max_diff"] for i in range(N)]
seed_too = [measure(row, (f"seed={i}",), replication=i)["max_diff"] for i in range(N)]
fig, ax = plt.subplots(figsize=(6.5, 3.2))
ax.hist(
    [jitter_only, seed_too],
    bins=np.linspace(0, 260, 27),
    label=["jitter only", "jitter and workload seed"],
)
ax.axvline(row.max_diff, color="k", ls=":", label="paper (one run)")
ax.set_xlabel("Table 5, VTC: Max Diff (tokens)")
ax.set_ylabel(f"replications (of {N})")
ax.legend()
plt.show()
print("jitter only:", sorted(round(v) for v in jitter_only))
print("jitter and workload seed:", sorted(round(v) for v in seed_too))


# %% [markdown]
# ## The real trace: service rate per client under FCFS, VTC and RPM(20) (Figs. 12-14)
# RPM's dilemma: a limit tight enough to make service even rejects hundreds of requests and cuts
# throughput; a loose one is barely fairer than FCFS.


# %%
def run(*overrides: str):
    tl = simulate_config(compose_config(overrides))
    return tl.requests_frame(), tl.tokens_frame()


policies = {
    "FCFS": ["policy=fcfs"],
    "VTC": ["policy=vtc"],
    "RPM(20)": ["policy=rpm", "policy.limit=20"],
}
fig, axes = plt.subplots(1, 3, figsize=(13, 3.4), sharey=True)
for ax, (name, extra) in zip(axes, policies.items()):
    requests, tokens = run("experiment=vtc_real", *extra)
    ticks = fairness.paper_ticks()
    rates = fairness.service_rates(fairness.served_intervals(requests, tokens), ticks)
    rates.plot(ax=ax, legend=False, title=name, lw=0.8)
    ax.set_xlabel("time (s)")
axes[0].set_ylabel("service rate (tokens/s)")
plt.show()
limits = (5, 20) if SCALE == "ci" else (5, 10, 15, 20, 30)
dilemma = []
for limit in limits:
    requests, tokens = run("experiment=vtc_real", "policy=rpm", f"policy.limit={limit}")
    s = fairness.fairness_summary(requests, tokens)
    dilemma.append(
        {"limit": limit, "tokens/s": s["throughput_tokens_per_s"], "max diff": s["max_diff"]}
    )
print(pd.DataFrame(dilemma).round(1))

# %% [markdown]
# ## Weighted VTC (Fig. 16): four clients with weights 1:2:3:4
# Each backlogged client's service rate is proportional to its weight.

# %%
requests, tokens = run("experiment=vtc_overload_weighted", "policy=vtc")  # the trace's weights
ticks = fairness.paper_ticks(total=360.0, warmup=20.0)
rates = fairness.service_rates(fairness.served_intervals(requests, tokens), ticks)
ax = rates.plot(figsize=(6.5, 3.4), title="weighted VTC, weights 1:2:3:4")
ax.set_xlabel("time (s)")
ax.set_ylabel("service rate (tokens/s)")
plt.show()
middle = rates.loc[(rates.index > 60) & (rates.index < 300)].mean()
print("service shares while all are backlogged:", (middle / middle.iloc[0]).round(2).to_dict())
