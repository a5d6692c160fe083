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
# # VTC paper, synthetic suites: Figures 3-10 and Theorem 4.4's bound
#
# Each suite (`experiment=vtc_*`, the artifact's traces and engine: 10,000-token pool, 32-token
# reservation per client, A10G / Llama-7B step times) under FCFS, LCF and VTC: per-client
# service rate (the paper's 60 s windows at its ticks), response time, and the accumulated
# service difference. Full scale: the paper's 10 minutes per suite (`SCALE = "full"`, a few
# minutes); CI: the first 120 s of Figures 3, 5 and 10.
#
# Full-scale command (needs the `notebooks` extra; do not commit the executed outputs):
# `jupytext --to ipynb --execute notebooks/vtc_synthetic.py`

# %% tags=["parameters"]
SCALE = "full"

# %%
import matplotlib.pyplot as plt
import numpy as np

from simulator.api import build_trace, compose_config, simulate_config
from simulator.metrics import fairness

SUITES = {
    "vtc_overload": "Fig. 3",
    "vtc_proportional": "Fig. 4",
    "vtc_on_off_less": "Fig. 5",
    "vtc_on_off_overload": "Fig. 6",
    "vtc_poisson_short_long": "Fig. 7",
    "vtc_poisson_short_long_2": "Fig. 8",
    "vtc_increase": "Fig. 9",
    "vtc_dist_shift": "Fig. 10",
}
if SCALE == "ci":
    SUITES = {k: SUITES[k] for k in ("vtc_overload", "vtc_on_off_less", "vtc_dist_shift")}
POLICIES = ("fcfs", "lcf", "vtc")
HORIZON = {"ci": 120.0, "full": None}[SCALE]


def run(experiment: str, policy: str):
    overrides = [f"experiment={experiment}", f"policy={policy}"]
    if HORIZON is not None:
        overrides.append(f"engine.horizon={HORIZON}")
    cfg = compose_config(overrides)
    trace = build_trace(cfg)
    if HORIZON is not None:
        trace = trace.take(np.flatnonzero(trace.arrival < HORIZON))
    tl = simulate_config(cfg, trace)
    return tl.requests_frame(), tl.tokens_frame(), int(cfg.engine.pool_tokens)


runs = {(s, p): run(s, p) for s in SUITES for p in POLICIES}
TOTAL = HORIZON or 600.0
ticks = fairness.paper_ticks(total=TOTAL, warmup=TOTAL / 20)

# %% [markdown]
# ## Service rate per client (top row of each figure) and response time (bottom row)

# %%
for suite, figure in SUITES.items():
    fig, axes = plt.subplots(2, len(POLICIES), figsize=(4 * len(POLICIES), 5), sharex=True)
    for col, policy in enumerate(POLICIES):
        requests, tokens, _ = runs[(suite, policy)]
        rates = fairness.service_rates(fairness.served_intervals(requests, tokens), ticks)
        rates.plot(ax=axes[0][col], title=f"{policy}", legend=col == 0)
        fairness.response_times(requests, ticks).plot(ax=axes[1][col], legend=False)
        axes[1][col].set_xlabel("time (s)")
    axes[0][0].set_ylabel("service (tokens/s)")
    axes[1][0].set_ylabel("response time (s)")
    fig.suptitle(f"{suite} ({figure})")
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ## Accumulated service difference in every suite
# max_i W_i(0, t) - min_i W_i(0, t) over time (the paper's third row of each figure). In suites
# where one client asks for less than its share (on/off, increase), the difference measures how
# far ahead the heavier client got, which every policy allows; VTC keeps it bounded while both
# are backlogged.

# %%
times = np.linspace(1.0, TOTAL, 200)
ncols = min(4, len(SUITES))
nrows = -(-len(SUITES) // ncols)
fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3 * nrows), squeeze=False)
for ax, (suite, figure) in zip(axes.flat, SUITES.items()):
    for policy in POLICIES:
        requests, tokens, _ = runs[(suite, policy)]
        diff = fairness.accumulated_difference(fairness.served_intervals(requests, tokens), times)
        ax.plot(diff.index, diff.to_numpy(), label=policy)
    ax.set_title(f"{suite}\n({figure})", fontsize=8)
    ax.set_xlabel("time (s)")
axes[0][0].set_ylabel("accumulated difference (tokens)")
axes[0][0].legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Accumulated service difference and Theorem 4.4
# Theorem 4.4: for two clients backlogged over [t1, t2), VTC keeps
# |W_f(t1, t2) - W_g(t1, t2)| <= 2U with U = max(w_p L_input, w_q M) / min w
# (M = 10,000 tokens, w_p = 1, w_q = 2, so 2U = 40,000). In the overload suite both clients are
# backlogged throughout, so the accumulated difference is the theorem's quantity: VTC's stays
# under 2U while FCFS's grows linearly. (Lemma 4.3 as stated needs the decode tokens a batch
# still owes; tests/test_fairness_theory.py checks the corrected bound.)

# %%
suite = "vtc_overload"
times = np.linspace(1.0, TOTAL, 200)
fig, ax = plt.subplots(figsize=(6.5, 3.5))
for policy in POLICIES:
    requests, tokens, pool = runs[(suite, policy)]
    diff = fairness.accumulated_difference(fairness.served_intervals(requests, tokens), times)
    ax.plot(diff.index, diff.to_numpy(), label=policy)
u = max(1.0 * requests.prompt_len.max(), 2.0 * pool)
ax.axhline(2 * u, color="k", ls=":", label="2U (Theorem 4.4)")
ax.set_xlabel("time (s)")
ax.set_ylabel("max_i W_i - min_i W_i (tokens)")
ax.legend()
plt.show()
worst = {
    p: float(
        fairness.accumulated_difference(
            fairness.served_intervals(*runs[(suite, p)][:2]), times
        ).max()
    )
    for p in POLICIES
}
print({p: round(v) for p, v in worst.items()}, "2U =", 2 * u)

# %% [markdown]
# ## Fig. 15: memory pool and request length ablation
# Llama-2-13B on an A100-80GB (roofline step times), pools of 35,000 and 65,000 tokens, two
# clients at [6, 12], [3, 6], [1.5, 3] and [1, 2] requests/s for prompt = output = 128, 256,
# 512 and 768 tokens (the ablation's overload-s4 suite). The paper's "long" variant has no stated
# lengths and is left out. Where the engine is overloaded VTC's average difference is a fraction
# of FCFS's at both pools; where it keeps up with both clients (128-token requests on this
# roofline model) the two policies serve identically.

# %%
import pandas as pd

ABLATION = {128: (6.0, 12.0), 256: (3.0, 6.0), 512: (1.5, 3.0), 768: (1.0, 2.0)}
rows = []
for pool in (35_000, 65_000):
    for length, (r0, r1) in ABLATION.items():
        for policy in ("fcfs", "vtc"):
            overrides = [
                "experiment=vtc_overload",
                f"policy={policy}",
                "cost_model=roofline",
                "cost_model.model=llama-2-13b",
                f"engine.pool_tokens={pool}",
                f"workload.rates=[{r0},{r1}]",
                f"workload.duration={TOTAL}",
                f"workload.input_range=[{length},{length + 1}]",
                f"workload.output_range=[{length},{length + 1}]",
            ]
            tl = simulate_config(compose_config(overrides))
            s = fairness.fairness_summary(tl.requests_frame(), tl.tokens_frame())
            rows.append(
                {
                    "pool": pool,
                    "length": length,
                    "policy": policy,
                    "max diff": s["max_diff"],
                    "avg diff": s["avg_diff"],
                    "tokens/s": s["throughput_tokens_per_s"],
                }
            )
ablation = pd.DataFrame(rows)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
for ax, pool in zip(axes, (35_000, 65_000)):
    part = ablation[ablation.pool == pool]
    part.pivot(index="length", columns="policy", values="avg diff").plot(ax=ax, marker="o")
    ax.set_title(f"pool {pool:,} tokens")
    ax.set_ylabel("avg service difference (tokens/s)")
plt.show()
ablation.round(1)
