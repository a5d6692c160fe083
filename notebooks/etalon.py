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
# # Etalon: fluidity-index, fluid token generation rate, capacity under a deadline-miss SLO
#
# Full scale: `SCALE = "full"` (loads 0.25-2.0 of the VTC overload suite for 600 s, Etalon's
# capacity search with 2,000 requests per probe; a few minutes). CI: 3 loads for 60 s and 300
# requests per probe.
#
# Full-scale command (needs the `notebooks` extra; do not commit the executed outputs):
# `jupytext --to ipynb --execute notebooks/etalon.py`

# %% tags=["parameters"]
SCALE = "full"

# %% [markdown]
# ## The deadline illustration: an early stall costs fluidity, a late one does not
# Two streams with the same TBT percentiles and TPOT (Etalon §4): one stalls 160 ms right after
# the first token, one at the end. With D_p = 0.5 s and D_d = 0.1 s the late stall is absorbed by
# the slack the stream has built up; the early one misses a deadline.

# %%
import matplotlib.pyplot as plt
import numpy as np

from simulator.metrics import fluidity_index

early = [0.5, 0.16] + [0.04] * 19
late = [0.5] + [0.04] * 19 + [0.16]
for name, gaps in (("early stall", early), ("late stall", late)):
    f, missed, total = fluidity_index(gaps, ttft_deadline=0.5, tbt_deadline=0.1)
    print(
        f"{name}: P90 TBT {np.percentile(gaps[1:], 90):.3f} s, TPOT {np.mean(gaps[1:]):.4f} s,"
        f" fluidity {f:.3f} ({missed} of {total} deadlines missed)"
    )
fig, ax = plt.subplots(figsize=(6, 3))
for name, gaps in (("early stall", early), ("late stall", late)):
    ax.step(np.cumsum(gaps), np.arange(1, len(gaps) + 1), where="post", label=name)
deadlines = 0.5 + 0.1 * np.arange(len(early))
ax.plot(deadlines, np.arange(1, len(early) + 1), "k:", label="token deadlines (D_p + k D_d)")
ax.set_xlabel("time (s)")
ax.set_ylabel("tokens received")
ax.legend()
plt.show()

# %% [markdown]
# ## Fluidity and fluid token generation rate across policies and loads

# %%
import pandas as pd
from hydra.utils import instantiate

from simulator.api import compose_config, simulate_config
from simulator.api.prefill_profile import profile_prefill
from simulator.metrics.prefill_curve import fit_prefill_curve
from simulator.metrics.qoe import qoe_summary

LOADS = {"ci": (0.5, 1.0, 1.5), "full": (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)}[SCALE]
DURATION = {"ci": 60, "full": 600}[SCALE]
rows = []
for policy in ("fcfs", "vtc", "lcf"):
    for load in LOADS:
        overrides = [f"policy={policy}", f"workload.rate_scale={load}"]
        cfg = compose_config([*overrides, f"workload.duration={DURATION}"])
        timeline = simulate_config(cfg)
        engine, cost = instantiate(cfg.engine), instantiate(cfg.cost_model)
        qoe_cfg = instantiate(cfg.qoe, _convert_="all")
        curve = fit_prefill_curve(profile_prefill(cost, engine))
        q = qoe_summary(timeline.requests_frame(), timeline.tokens_frame(), qoe_cfg, curve)
        rows.append(
            {
                "policy": policy,
                "load": load,
                "fluidity mean": q["fluidity"]["mean"],
                "fluidity p10": q["fluidity"]["p10"],
                "fluid token rate (tok/s)": q["fluid_token_rate"],
            }
        )
sweep = pd.DataFrame(rows)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
for ax, column in zip(axes, ("fluidity mean", "fluid token rate (tok/s)")):
    sweep.pivot(index="load", columns="policy", values=column).plot(ax=ax, marker="o")
    ax.set_title(column)
plt.show()
sweep.round(3)

# %% [markdown]
# ## Capacity under a deadline-miss SLO (Etalon's search)
# The highest Poisson rate at which the P99 over requests of the deadline-miss rate stays at or
# below 10% (D_d = 30 ms, D_p = profiled prefill time + 0.3 s), for Llama-2-7B on an A100
# (roofline step times). On the A10G model a decode step alone takes 36-40 ms, longer than
# D_d, so almost no load passes there (`fairsim-capacity` finds about 0.25 requests/s).

# %%
from simulator.apps.capacity.cli import capacity_search

PER_PROBE = {"ci": 300, "full": 2000}[SCALE]
found = {}
for policy in ("fcfs", "vtc"):
    cfg = compose_config(
        [f"policy={policy}", "cost_model=roofline", f"capacity.num_requests={PER_PROBE}"],
        config_name="capacity",
    )
    (result,) = capacity_search(cfg)
    found[policy] = result.best_value
    print(f"{policy}: capacity {result.best_value} requests/s ({result.note})")
    for probe in result.history:
        print(f"   rate {probe.value:g}: {'pass' if probe.passed else 'fail'}")
