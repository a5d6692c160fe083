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
# # fairsim quick start: one run, its per-token timeline, its metrics
#
# The VTC paper's two-client overload workload (the `fairsim` default) under FCFS and VTC on the
# A10G / Llama-7B cost model. Full scale is the paper's 10 minutes; CI runs `SCALE = "ci"` (60 s
# of arrivals).
#
# Full-scale command (needs the `notebooks` extra; do not commit the executed outputs):
# `jupytext --to ipynb --execute notebooks/quickstart.py`

# %% tags=["parameters"]
SCALE = "full"

# %%
import matplotlib.pyplot as plt

from simulator.api import compose_config, simulate_config
from simulator.metrics import fairness, latency

DURATION = {"ci": 60, "full": 600}[SCALE]


def run(policy: str):
    cfg = compose_config([f"policy={policy}", f"workload.duration={DURATION}"])
    timeline = simulate_config(cfg)
    return timeline.requests_frame(), timeline.tokens_frame(), timeline.steps_frame()


runs = {policy: run(policy) for policy in ("fcfs", "vtc")}
requests, tokens, steps = runs["vtc"]
requests.head()

# %% [markdown]
# Every request is accounted for (completed, rejected, refused or still in flight at the
# horizon), and every output token has its own emission time.

# %%
print(requests.status.value_counts().to_dict())
tokens.head()

# %% [markdown]
# ## The per-token timeline of three requests
# Each dot is one output token; the first comes from the prefill step, the rest one per decode
# step. Flat stretches are stalls while the engine prefilled other requests.

# %%
fig, ax = plt.subplots(figsize=(7, 3.2))
for rid in requests.request_id.iloc[[0, len(requests) // 2, -1]]:
    t = tokens[tokens.request_id == rid]
    ax.plot(t.time, t["index"], ".", ms=2, label=f"request {rid}")
ax.set_xlabel("time (s)")
ax.set_ylabel("output token index")
ax.legend()
plt.show()

# %% [markdown]
# ## Latency per client (TTFT, TPOT, E2E) and token throughput

# %%
for policy, (r, t, _) in runs.items():
    summary = latency.latency_summary(r, t)
    print(
        policy,
        f"throughput {latency.token_throughput(r):.0f} tokens/s;",
        "; ".join(
            f"{client}: TTFT mean {s['ttft']['mean']:.2f} s, E2E p90 {s['e2e']['p90']:.1f} s"
            for client, s in summary.items()
        ),
    )

# %% [markdown]
# ## Service per client over time (the VTC paper's view of fairness)
# Client 1 asks for twice client 0's rate. FCFS serves them as they ask; VTC gives both the same
# service while both are backlogged.

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
for ax, (policy, (r, t, _)) in zip(axes, runs.items()):
    ticks = fairness.paper_ticks(total=DURATION, warmup=DURATION / 20)
    rates = fairness.service_rates(fairness.served_intervals(r, t), ticks)
    rates.plot(ax=ax, title=policy)
    ax.set_xlabel("time (s)")
axes[0].set_ylabel("service rate (tokens/s, w_p=1, w_q=2)")
plt.show()
