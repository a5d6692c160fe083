"""The validation report: every published figure fairsim reproduces, with error bars.

`fairsim-validation` runs each experiment `--replications` times (default 20) with the
paper-suite step-time jitter and run speed (replication i: jitter seed i, and policy seed i for
a policy with its own random stream, such as VTC(±50%)'s prediction errors; the workload
unchanged) and writes `docs/validation.md`: for each published number the simulated median and
[p5, p95], and whether the number lies in that interval, within 15% of the median, or out (with
the reason, where one is known). Claims without a single number (a bound, "A throttles fewer
than B") are reported as how many replications they hold in, on the experiment shaped to show
them and on the others.

Sections: the VTC paper's Tables 2-6 and the response times of its real-trace runs; its
synthetic suites (Theorem 4.4's bound, weighted VTC's shares, the overload suite's row with the
arrivals' phase varied); FairServe's published figures and claims; Etalon's stall example;
measured vLLM runs on GPUs (`fairsim-sim2real`'s report, where its data is installed).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from simulator.api.run import compose_config, simulate_config
from simulator.apps.common.command import run_command
from simulator.apps.papers import fairserve_table, vtc_tables
from simulator.apps.sim2real.report import sim2real_report
from simulator.apps.sweeps.replications import PAPER_SUITE_JITTER_CV, paper_replication, verdict
from simulator.core.errors import ConfigError
from simulator.metrics import fairness, fluidity_index
from simulator.report.run_folder import write_text_atomically
from traces import TraceError
from traces.files import resolve_path

SECTIONS = ("vtc-tables", "vtc-suites", "fairserve", "etalon", "sim2real")
# the measured vLLM runs the sim2real section predicts, in a data folder (FAIRSIM_DATA_DIR):
# inference-perf run summaries under RUNS, runs logged request by request under REPLAYS
SIM2REAL_RUNS = "data:sim2real/inference_sim_training/default_args"
SIM2REAL_REPLAYS = "data:sim2real/llmservingsim"

# The VTC artifact's measured real-trace runs (time to first token of served requests, s).
VTC_RESPONSE: dict[str, dict[str, float]] = {
    "FCFS": {"ttft_mean_s": 46.8, "ttft_median_s": 39.0},
    "VTC": {"ttft_mean_s": 39.7, "ttft_median_s": 4.9, "ttft_p99_s": 211.0},
    "RPM(5)": {"ttft_mean_s": 0.21},
    "RPM(10)": {"ttft_mean_s": 0.47},
    "RPM(15)": {"ttft_mean_s": 1.73},
    "RPM(20)": {"ttft_mean_s": 3.68},
    "RPM(30)": {"ttft_mean_s": 19.9},
}
VTC_METRICS = (  # (key in vtc_tables.measure, label, attribute of PaperRow, decimals)
    ("max_diff", "Max Diff", "max_diff", 2),
    ("avg_diff", "Avg Diff", "avg_diff", 2),
    ("diff_var", "Diff Var", "diff_var", 2),
    ("throughput_tokens_per_s", "tokens/s", "throughput", 0),
    ("rejected", "rejected", "rejected", 0),
)
VTC_KEYS = ("max_diff", "avg_diff", "diff_var")
# figures of Tables 2-6's rows that the paper does not print: they come from the artifact's
# measured logs (scored as the paper scores them); the report marks them with a dagger
FROM_ARTIFACT_LOGS = {
    ("5", "FCFS", "max_diff"),
    ("5", "FCFS", "avg_diff"),
    ("2", "RPM(10)", "throughput_tokens_per_s"),
    ("2", "RPM(15)", "throughput_tokens_per_s"),
    *(("2", f"RPM({n})", "rejected") for n in (5, 10, 15, 20, 30)),
    *(("2", label, key) for label, figures in VTC_RESPONSE.items() for key in figures),
}

# Why a published figure falls outside, as far as it is understood; printed beside the cell
# when (and only when) it is out. Keys: the finding's `key`.
_ALIAS = (
    "VTC serves the two clients in alternating batches of 20 requests, in the artifact's log as "
    "in fairsim; this figure is that alternation seen through the 60 s scoring windows, so it "
    "swings with the run's speed within a percent. The artifact's VTC runs of this suite went "
    "0.8% faster than the cost model (a cycle of batches lasts 11.345 s in its VTC log, "
    "11.675 s in its FCFS log, 11.433 s in fairsim); one unjittered run at that speed, every "
    "step time x 0.9925, gives Max / Avg Diff / Diff Var 137.9 / 77.1 / 2,633 on Table 4 and "
    "190.8 / 112.0 / 5,231 on Table 5, at the model's own speed 142.1 / 86.4 / 1,756 and "
    "195.9 / 122.3 / 3,909 (benchmarks/vtc_step_time_sensitivity.py --scales 0.9925,1); "
    "replications whose run speed falls that close are few"
)
_VARIANCE = (
    "a variance: it scales with the square of the differences, so Max and Avg Diff within "
    "15% leave it further out"
)
_REAL_TRACE_ALTERNATION = (
    "from about 250 s on, the real trace's two heaviest clients (rank-8-2 and rank-8-10) are "
    "both backlogged and VTC serves them in alternating runs of admissions, in the artifact's "
    "log as in fairsim; Max Diff, Avg Diff and Diff Var follow how unequal the 60 s windows "
    "find the two, which depends on how the runs fall against the windows. Over the last ten "
    "windows |s2 - s10| / (s2 + s10) averages 0.38 in the log (its most unequal window, "
    "456-516 s: rank-8-2 served at 428 tokens/s, rank-8-10 at 40) and 0.10-0.44 in the "
    "replications, one of 20 as unequal as the log; those at 0.3 or more give Max / Avg Diff / "
    "Diff Var 514-747 / 339-364 / 9,645-22,120 (benchmarks/vtc_real_alternation.py)"
)
_FAIRSERVE_TRACE = (
    "the artifact's trace is not public: fairsim's stand-in matches its published shape "
    "(users, apps, calls, the heavy user) but its lengths and per-user rates are a choice, "
    "and these counts follow them"
)
REASONS: dict[str, str] = {
    **{f"vtc/{table}/VTC/{key}": _ALIAS for table in ("4", "5") for key in VTC_KEYS},
    **{f"suites/regimes/{key}": _ALIAS for key in ("max_diff", "avg_diff")},
    "vtc/2/VTC(oracle)/diff_var": _VARIANCE,
    **{f"vtc/3/VTC/{key}": _REAL_TRACE_ALTERNATION for key in VTC_KEYS},
    **{f"vtc/6/{label}/diff_var": _VARIANCE for label in ("VTC(±50%)", "VTC(oracle)")},
    "fairserve/fairserve_overload/rpm_interaction/throttled_requests": _FAIRSERVE_TRACE,
    "fairserve/fairserve_overload/rpm_interaction/throttled_interactions": _FAIRSERVE_TRACE,
    "fairserve/fairserve_overload/rpm_interaction/wasted_tokens": _FAIRSERVE_TRACE,
    "fairserve/fairserve_overload/fairserve/throttled_requests": _FAIRSERVE_TRACE,
}


@dataclass
class Finding:
    """One published number beside the replications' values."""

    key: str  # unique, stable: "vtc/2/FCFS/max_diff"
    what: str
    published: float | tuple[float, float]
    values: list[float]
    decimals: int = 2
    note: str = ""

    @property
    def verdict(self) -> str:
        finite = [v for v in self.values if math.isfinite(v)]
        return verdict(finite, self.published, self.decimals) if finite else "out"


@dataclass
class Claim:
    """A published claim with no single number: in how many replications it holds."""

    what: str
    experiment: str
    shaped: bool  # the experiment was built to show this claim
    holds: list[bool]
    detail: str = ""


@dataclass
class Section:
    title: str
    intro: str
    findings: list[Finding] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    body: str = ""  # tables of its own, as Markdown (the sim2real section's)


# ---------------------------------------------------------------- runs (one replication each)


def vtc_row(index: int, i: int) -> dict[str, Any]:
    return vtc_tables.measure(vtc_tables.ROWS[index], replication=i)


def overload_regimes(i: int) -> dict[str, Any]:
    """Table 5's VTC row with the workload seed varied too (seed i): the arrival phase."""
    row = next(r for r in vtc_tables.ROWS if r.table == "5" and r.label == "VTC")
    return vtc_tables.measure(row, (f"seed={i}",), replication=i)


def theorem_bound(policy: str, i: int) -> dict[str, float]:
    """The overload suite's largest accumulated service difference and Theorem 4.4's 2U."""
    cfg = compose_config(["experiment=vtc_overload", f"policy={policy}"])
    cfg = paper_replication(cfg, i, vtc_tables.ARTIFACT_RUN_SPEED_CV)
    timeline = simulate_config(cfg)
    requests = timeline.requests_frame()
    intervals = fairness.served_intervals(requests, timeline.tokens_frame())
    times = np.linspace(1.0, float(cfg.workload.duration), 200)
    worst = float(fairness.accumulated_difference(intervals, times).max())
    u = max(1.0 * float(requests["prompt_len"].max()), 2.0 * float(cfg.engine.pool_tokens))
    return {"max_accumulated_diff": worst, "two_u": 2 * u}


def weighted_shares(i: int) -> dict[str, float]:
    """Weighted VTC (Fig. 16): each client's service rate over client 0's while all four are
    backlogged (60-300 s of the 360 s run)."""
    cfg = compose_config(["experiment=vtc_overload_weighted", "policy=vtc"])
    cfg = paper_replication(cfg, i, vtc_tables.ARTIFACT_RUN_SPEED_CV)
    timeline = simulate_config(cfg)
    intervals = fairness.served_intervals(timeline.requests_frame(), timeline.tokens_frame())
    rates = fairness.service_rates(intervals, fairness.paper_ticks(total=360.0, warmup=20.0))
    middle = rates.loc[(rates.index > 60) & (rates.index < 300)].mean()
    return {f"share_{k}": float(middle.iloc[k] / middle.iloc[0]) for k in range(len(middle))}


def fairserve_cell(experiment: str, policy: str, i: int) -> dict[str, float]:
    return fairserve_table.measure(experiment, policy, replication=i)


RUNS: dict[str, Callable[..., dict[str, Any]]] = {
    "vtc_row": vtc_row,
    "overload_regimes": overload_regimes,
    "theorem_bound": theorem_bound,
    "weighted_shares": weighted_shares,
    "fairserve_cell": fairserve_cell,
}
Task = tuple[Any, ...]  # (name in RUNS, *arguments), the replication index last


def _run(task: Task) -> dict[str, Any]:
    return RUNS[task[0]](*task[1:])


def run_all(tasks: list[Task], jobs: int) -> dict[Task, dict[str, Any]]:
    """Every task, in `jobs` spawned processes (nothing of this process is shared), with a
    progress line on stderr every 5%; results by task."""
    results: dict[Task, dict[str, Any]] = {}
    start, every = time.perf_counter(), max(1, len(tasks) // 20)
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        for done, (task, result) in enumerate(zip(tasks, pool.map(_run, tasks)), 1):
            results[task] = result
            if done % every == 0 or done == len(tasks):
                elapsed = time.perf_counter() - start
                print(f"validation: {done}/{len(tasks)} runs, {elapsed:.0f} s", file=sys.stderr)
    return results


# ---------------------------------------------------------------- sections


def vtc_tables_section(n: int, tables: Sequence[str] | None) -> tuple[list[Task], Callable]:
    rows = [k for k, r in enumerate(vtc_tables.ROWS) if not tables or r.table in tables]
    tasks = [("vtc_row", k, i) for k in rows for i in range(n)]

    def build(results: dict[Task, dict[str, Any]]) -> Section:
        section = Section(
            "VTC paper: Tables 2-6",
            "Each row is an experiment config plus a policy (`fairsim-vtc-tables` lists them); "
            "the same engine, cost model and metric conventions for every row, and every VTC "
            "and LCF row the artifact's counter lift and counting (its router's update_counter: "
            "each decode step priced by the lengths before it, and a step in which a request "
            "finishes charging its whole batch once more). Service "
            "difference in the paper's revision form (60 s windows, 19 ticks); Tables 3 and 4 "
            "score with the profiled cost function (the artifact's coefficients, a tenth of "
            "those Appendix B.2 prints). Figures marked † are not printed in the paper: they "
            "come from the artifact's measured logs (the response times, rejected counts, "
            "RPM(10) and RPM(15) throughput, Table 5's FCFS row).",
        )
        for k in rows:
            row = vtc_tables.ROWS[k]
            runs = [results[("vtc_row", k, i)] for i in range(n)]
            published = [(key, label, getattr(row, attr), d) for key, label, attr, d in VTC_METRICS]
            if row.table == "2":
                published += [
                    (key, key.replace("_s", " (s)").replace("_", " "), value, 2)
                    for key, value in VTC_RESPONSE.get(row.label, {}).items()
                ]
            for key, label, value, decimals in published:
                if value is None:
                    continue
                section.findings.append(
                    Finding(
                        f"vtc/{row.table}/{row.label}/{key}",
                        f"Table {row.table} · {row.label} · {label}"
                        + (" †" if (row.table, row.label, key) in FROM_ARTIFACT_LOGS else ""),
                        float(value),
                        [float(m[key]) for m in runs],
                        decimals,
                    )
                )
        return section

    return tasks, build


def vtc_suites_section(n: int) -> tuple[list[Task], Callable]:
    tasks: list[Task] = [("theorem_bound", p, i) for p in ("vtc", "fcfs") for i in range(n)]
    tasks += [("weighted_shares", i) for i in range(n)]
    tasks += [("overload_regimes", i) for i in range(n)]

    def build(results: dict[Task, dict[str, Any]]) -> Section:
        section = Section(
            "VTC paper: synthetic suites",
            "Theorem 4.4 bounds the service difference of two backlogged clients under VTC by 2U "
            "(U = max(w_p L_input, w_q M) / min w; 2U = 40,000 tokens here); in the overload "
            "suite (Fig. 3) both clients are backlogged throughout. Fig. 16: weighted VTC "
            "serves backlogged clients in proportion to their weights 1:2:3:4. In the overload "
            "suite VTC alternates whole batches between the two clients; Table 5's VTC row "
            "with the workload seed varied as well as the jitter shows whether the arrivals' "
            "phase moves its differences (with the kernel-fit cost it split them into two "
            "regimes; with the end-to-end fit every seed lands in one).",
        )
        bound = {p: [results[("theorem_bound", p, i)] for i in range(n)] for p in ("vtc", "fcfs")}
        two_u = bound["vtc"][0]["two_u"]
        vtc_worst = [r["max_accumulated_diff"] for r in bound["vtc"]]
        fcfs_worst = [r["max_accumulated_diff"] for r in bound["fcfs"]]
        section.claims.append(
            Claim(
                "Theorem 4.4: VTC keeps the accumulated service difference <= 2U",
                "vtc_overload",
                True,
                [w <= two_u for w in vtc_worst],
                f"largest difference {_interval(vtc_worst, 0)} tokens; 2U = {two_u:,.0f}",
            )
        )
        section.claims.append(
            Claim(
                "FCFS has no such bound: its difference exceeds VTC's",
                "vtc_overload",
                True,
                [f > v for f, v in zip(fcfs_worst, vtc_worst, strict=True)],
                f"FCFS's largest difference {_interval(fcfs_worst, 0)} tokens",
            )
        )
        shares = [results[("weighted_shares", i)] for i in range(n)]
        for k in range(1, len(shares[0])):
            section.findings.append(
                Finding(
                    f"suites/weighted/share_{k}",
                    f"Fig. 16 · client {k} service / client 0 service",
                    float(k + 1),
                    [s[f"share_{k}"] for s in shares],
                    1,
                )
            )
        row = next(r for r in vtc_tables.ROWS if r.table == "5" and r.label == "VTC")
        regimes = [results[("overload_regimes", i)] for i in range(n)]
        for key, value in (("max_diff", row.max_diff), ("avg_diff", row.avg_diff)):
            values = [float(m[key]) for m in regimes]
            section.findings.append(
                Finding(
                    f"suites/regimes/{key}",
                    f"Table 5 · VTC · {key.replace('_', ' ')}, workload seed varied too",
                    float(value),
                    values,
                    2,
                    "values: " + ", ".join(f"{v:.0f}" for v in sorted(values)),
                )
            )
        return section

    return tasks, build


FAIRSERVE_POLICIES = ("fairserve", "rpm_interaction", "vtc")
FAIRSERVE_RATIO = (21.15, 25.0)  # Fig. 8a: RPM throttles 21.15x-25x the interactions
POLICY_NAMES = {"rpm_interaction": "RPM", "vtc": "VTC"}
# the paper's claims comparing FairServe with another policy: (claim, the experiment shaped to
# show it, the other policy, the figure compared, its label and decimals, holds(FairServe's,
# the other's))
PairClaim = tuple[str, str, str, str, str, int, Callable[[float, float], bool]]
FAIRSERVE_CLAIMS: tuple[PairClaim, ...] = (
    ("RPM throttles at least 10x the interactions FairServe throttles", "fairserve_overload",
     "rpm_interaction", "throttled_interactions", "throttled interactions", 0,
     lambda f, o: o >= 10 * f and o > 0),
    ("FairServe wastes no prompt tokens; RPM does", "fairserve_overload", "rpm_interaction",
     "wasted_tokens", "wasted tokens", 0, lambda f, o: f == 0 < o),
    ("Benign users' interactions finish sooner under FairServe than under VTC",
     "fairserve_sustained", "vtc", "benign_interaction_s", "mean interaction time (s)", 1,
     lambda f, o: f < o),
)  # fmt: skip


def fairserve_section(n: int) -> tuple[list[Task], Callable]:
    cells = [(e, p) for e in fairserve_table.EXPERIMENTS for p in FAIRSERVE_POLICIES]
    tasks = [("fairserve_cell", e, p, i) for e, p in cells for i in range(n)]

    def build(results: dict[Task, dict[str, Any]]) -> Section:
        section = Section(
            "FairServe",
            "`fairserve_overload` is shaped like the paper's artifact run (71 s, 1,358 users "
            "in 23 apps, one heavy user): the published figures are compared on it. "
            "`fairserve_sustained` was shaped to show that benign users' interactions finish "
            "sooner under FairServe than under VTC; `fairserve_no_overload` was shaped so that "
            "FairServe throttles nothing. Every claim is also given on the experiments not "
            "shaped for it. User limit 10 per minute for FairServe and RPM alike.",
        )
        run = {c: [results[("fairserve_cell", c[0], c[1], i)] for i in range(n)] for c in cells}
        for (experiment, policy), published in fairserve_table.PAPER.items():
            for key, value in published.items():
                section.findings.append(
                    Finding(
                        f"fairserve/{experiment}/{policy}/{key}",
                        f"{experiment} · {policy} · {key.replace('_', ' ')}",
                        float(value),
                        [float(m[key]) for m in run[(experiment, policy)]],
                        0,
                    )
                )
        ratios = [
            m_rpm["throttled_interactions"] / max(m_fs["throttled_interactions"], 1)
            for m_rpm, m_fs in zip(
                run[("fairserve_overload", "rpm_interaction")],
                run[("fairserve_overload", "fairserve")],
                strict=True,
            )
        ]
        section.findings.append(
            Finding(
                "fairserve/overload/throttling_ratio",
                "fairserve_overload · RPM's throttled interactions / FairServe's (Fig. 8a)",
                FAIRSERVE_RATIO,
                ratios,
                2,
            )
        )
        for experiment in fairserve_table.EXPERIMENTS:
            fs = run[(experiment, "fairserve")]
            for what, shaped_on, other, key, label, digits, holds in FAIRSERVE_CLAIMS:
                them = run[(experiment, other)]
                section.claims.append(
                    Claim(
                        what,
                        experiment,
                        experiment == shaped_on,
                        [holds(f[key], o[key]) for f, o in zip(fs, them, strict=True)],
                        f"{label}: FairServe {_interval([m[key] for m in fs], digits)}, "
                        f"{POLICY_NAMES[other]} {_interval([m[key] for m in them], digits)}",
                    )
                )
        fs = run[("fairserve_no_overload", "fairserve")]
        section.claims.append(
            Claim(
                "Without overload FairServe throttles nothing (only this experiment is not "
                "overloaded)",
                "fairserve_no_overload",
                True,
                [f["throttled_requests"] == 0 for f in fs],
                "FairServe throttled calls " + _interval([m["throttled_requests"] for m in fs], 0),
            )
        )
        return section

    return tasks, build


def etalon_section() -> Section:
    """Etalon's stall example (the figure of its fluidity-index section): deterministic."""
    section = Section(
        "Etalon",
        "The stall example: a stream of 20 decode tokens, 40 ms apart but for one 160 ms stall, "
        "with D_p = 0.5 s and D_d = 0.1 s; the stall right after the first token misses a "
        "deadline, the same stall at the end is absorbed by the slack built up before it. "
        "Both streams have the same P90 TBT and TPOT. No replication: nothing here is random.",
    )
    early = [0.5, 0.16] + [0.04] * 19
    late = [0.5] + [0.04] * 19 + [0.16]
    for name, gaps, published in (("early stall", early, 0.95), ("late stall", late, 1.0)):
        value, _, _ = fluidity_index(gaps, ttft_deadline=0.5, tbt_deadline=0.1)
        section.findings.append(
            Finding(f"etalon/{name}/fluidity", f"{name} · fluidity-index", published, [value])
        )
    for name, gaps in (("early stall", early), ("late stall", late)):
        section.findings += [
            Finding(
                f"etalon/{name}/p90_tbt",
                f"{name} · P90 TBT (ms)",
                40.0,
                [1000 * float(np.percentile(gaps[1:], 90))],
                0,
            ),
            Finding(
                f"etalon/{name}/tpot",
                f"{name} · TPOT (ms)",
                46.0,
                [1000 * float(np.mean(gaps[1:]))],
                0,
            ),
        ]
    return section


# ---------------------------------------------------------------- the report


COST_MODEL_TEXT = """## How the cost model was obtained

The VTC rows and suites run the S-LoRA router engine with the artifact's engine facts (a
10,000-token KV pool, 32 KV tokens reserved per client in the batch) and the linear step cost of
Llama-7B on the artifact's A10G server (`cost_model=a10g_llama7b_artifact`): {terms}.

- Prefill terms: a least-squares fit to the VTC artifact's own kernel profile, shipped with
  fairsim (`data:vtc/`), at the speed below.
- Decode terms and `step_overhead` ({overhead_ms:.1f} ms per step, prefill or decode): shaped by
  the end-to-end timings of every request of the artifact's two FCFS runs (the real trace
  and the two-client overload suite, from its public result logs), as
  `cost_models.profiles.fit_router_timings` explains: a request's time between its first and
  last token is its decode steps, at the batch and context around it, plus the prefill steps
  of the requests that joined meanwhile. The kernel profile cannot separate these terms (it
  sized every batch to fill the pool, so batch size and context moved together) and does not
  see the router's own cost per step.
- Speed: every in-loop term of that fit times {centre:.5f}, the geometric mean of the speeds
  of the artifact's 22 logged runs (each run's median time per output token over the fit's
  for the same row; `cost_models.profiles.centred_on_runs`). Both FCFS runs went slower than
  the typical run; the replications' run speeds (below) are drawn around this centre.
- `frontend_latency` ({frontend_ms:.1f} ms): the time a request spends outside the loop (HTTP,
  tokenisation, the messages to and from it), the median of what the artifact's FCFS run of the
  real trace takes to a first token beyond fairsim's without it, over the requests fairsim
  serves at once; every logged run of the real trace shows 45-70 ms there.
- step-time jitter CV = {cv:g}: not fitted to any table but derived from the spread of Vidur's
  public operator timings (docs/metrics.md, section 8).
- run speed CV = {speed_cv:g} (the VTC rows and suites): one factor for every step of a
  replication's run, the spread of the same 22 speeds (docs/metrics.md, section 8). Its runs
  of one workload went at speeds a few percent apart: the two-client overload suite with the
  same batches under FCFS and under every VTC variant, its FCFS run about 3% slower than all of
  them. FairServe's experiments take none: no log of its testbed measures a spread.

No number of the tables below was a target: the FCFS throughputs (777 and 876 tokens/s
published) are checks like every other figure.

FairServe's artifact-shaped run uses the analytic roofline of Llama-2-7B on an A100-80GB
(`cost_model=roofline`: the GPU's datasheet peaks at 60% compute and 80% memory efficiency,
checked against a layer measured on an H100); its other two experiments use the kernel fit
(`cost_model=a10g_llama7b`, the default, with a 4 ms step overhead)."""


def cost_model_text() -> str:
    """How the cost models were obtained and which single constants were calibrated, with the
    values the configs hold now."""
    cost = compose_config(["experiment=vtc_overload"]).cost_model
    terms = ", ".join(f"`{k}` = {float(v):.4g}" for k, v in cost.items() if k != "_target_")
    return COST_MODEL_TEXT.format(
        terms=terms,
        overhead_ms=1000 * float(cost.step_overhead),
        frontend_ms=1000 * float(cost.frontend_latency),
        cv=PAPER_SUITE_JITTER_CV,
        speed_cv=vtc_tables.ARTIFACT_RUN_SPEED_CV,
        centre=vtc_tables.ARTIFACT_SPEED_CENTRE,
    )


def _interval(values: Sequence[float], digits: int) -> str:
    p5, p50, p95 = np.percentile(values, [5, 50, 95])
    return f"{p50:,.{digits}f} [{p5:,.{digits}f}, {p95:,.{digits}f}]"


def _published(value: float | tuple[float, float], decimals: int) -> str:
    shown = max(decimals, 0)
    if isinstance(value, tuple):
        return f"{value[0]:,.{shown}f} to {value[1]:,.{shown}f}"
    return f"{value:,.{shown}f}"


def _counts(findings: list[Finding]) -> str:
    verdicts = [f.verdict for f in findings]
    return ", ".join(f"{verdicts.count(v)} {label}" for v, label in (
        ("in", "in [p5, p95]"), ("15%", "within 15%"), ("out", "out")))  # fmt: skip


def render(sections: list[Section], n: int, command: str) -> str:
    every = [f for s in sections for f in s.findings]
    lines = [
        "# Validation: fairsim against the published figures",
        "",
        f"Generated by `{command}`. Each experiment ran {n} times with step-time jitter CV "
        f"{PAPER_SUITE_JITTER_CV:g} and, on the VTC artifact's server, a run speed CV "
        f"{vtc_tables.ARTIFACT_RUN_SPEED_CV:g} (every step of a replication's run also times one "
        "factor: its logged runs went at speeds a percent or two apart; replication i: jitter "
        "seed i, and policy seed i where the "
        "policy draws random numbers, as VTC(±50%) draws its prediction errors; the workload "
        "never changes). For "
        "each published number: the simulated median and [p5, p95] over the replications, and "
        "the verdict: **in** (within [p5, p95]; a figure stands for every value that rounds to "
        "it), **15%** (within 15% of the median), or **out**. Claims without a single number "
        "say in how many replications they hold; *shaped* marks the experiment built to show a "
        "claim.",
        "",
        f"All {len(every)} published numbers: {_counts(every)}.",
        "",
    ]
    for s in sections:
        lines += [f"- {s.title}: {_counts(s.findings)}" if s.findings else f"- {s.title}"]
    lines += ["", cost_model_text(), ""]
    for s in sections:
        lines += [f"## {s.title}", "", s.intro, ""]
        if s.findings:
            lines += [
                "| figure | published | simulated median [p5, p95] | verdict | note |",
                "|---|---:|---:|:---:|---|",
            ]
            for f in s.findings:
                note = f.note
                if f.verdict == "out" and f.key in REASONS:
                    note = f"{REASONS[f.key]}; {note}" if note else REASONS[f.key]
                digits = 2 if f.decimals > 0 else 0
                lines.append(
                    f"| {f.what} | {_published(f.published, f.decimals)} | "
                    f"{_interval(f.values, digits)} | {f.verdict} | {note} |"
                )
            lines.append("")
        if s.body:
            lines += [s.body, ""]
        if s.claims:
            lines += ["| claim | experiment | holds in | detail |", "|---|---|---:|---|"]
            for c in s.claims:
                shaped = " (shaped)" if c.shaped else ""
                lines.append(
                    f"| {c.what} | `{c.experiment}`{shaped} | {sum(c.holds)} of {len(c.holds)} "
                    f"| {c.detail} |"
                )
            lines.append("")
    return "\n".join(lines)


COUNTS = re.compile(r"(\d+) in \[p5, p95\], (\d+) within 15%, (\d+) out")


def _parts(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """A report's head (up to its first `## ` heading) and its sections by title, in order,
    each without trailing blank lines."""
    head: list[str] = []
    blocks: dict[str, list[str]] = {}
    current = head
    for line in text.splitlines():
        if line.startswith("## "):
            current = blocks.setdefault(line[3:], [])
        current.append(line)
    for lines in [head, *blocks.values()]:
        while lines and not lines[-1].strip():
            lines.pop()
    return head, blocks


def splice(base: str, other: str, titles: Sequence[str]) -> str:
    """The report `base` with the sections named `titles`, and their summary lines where they
    have one, taken from the report `other` (added at the end where `base` has none); the
    total line is recounted from the summary lines."""
    head, blocks = _parts(base)
    other_head, other_blocks = _parts(other)
    for title in titles:
        blocks[title] = other_blocks[title]
        line = [x for x in other_head if x == f"- {title}" or x.startswith(f"- {title}: ")]
        if not line:
            continue  # a section of its own (written by hand), outside the summary
        mine = [i for i, x in enumerate(head) if x == f"- {title}" or x.startswith(f"- {title}: ")]
        if mine:
            head[mine[0]] = line[0]
        else:  # a section `base` did not have: its line after the last one
            head.insert(max(i for i, x in enumerate(head) if x.startswith("- ")) + 1, line[0])
    found = [COUNTS.search(x) for x in head if x.startswith("- ")]
    total = [sum(int(m.group(k)) for m in found if m) for k in (1, 2, 3)]
    for i, x in enumerate(head):
        if x.startswith("All ") and "published numbers" in x:
            head[i] = (
                f"All {sum(total)} published numbers: {total[0]} in [p5, p95], {total[1]} "
                f"within 15%, {total[2]} out."
            )
    return "\n\n".join("\n".join(lines) for lines in [head, *blocks.values()]) + "\n"


def merge_into(old: str, report: str, chosen: Sequence[str] | None) -> str:
    """What to write over the report `old`: with `chosen` sections, `old` with those taken
    from `report` (every other one stays as it was); with all of them (None), `report` and
    the sections of `old` the command does not write (written by hand) after it."""
    if chosen is not None:
        return splice(old, report, chosen)
    ours = _parts(report)[1]
    return splice(report, old, [t for t in _parts(old)[1] if t not in ours])


def sim2real_section(explicit: bool, folder: Path) -> Section | None:
    """Measured vLLM runs predicted (`fairsim-sim2real`'s report, its headings one level
    down, its picture written into `folder`). Without the data: an error when the section was
    asked for, else a note and None."""
    try:
        runs, replays = resolve_path(SIM2REAL_RUNS, "data"), resolve_path(SIM2REAL_REPLAYS, "data")
    except TraceError as err:
        if explicit:
            raise
        print(f"fairsim-validation: the sim2real section is left out: {err}", file=sys.stderr)
        return None
    text = sim2real_report(runs, replays, folder)
    body = "\n".join(
        "#" + line if line.startswith("## ") else line
        for line in text.splitlines()
        if not line.startswith("# ")
    )
    return Section(
        "Measured vLLM runs (sim to real)",
        "Does fairsim predict a real engine? Each measured run simulated by the one command a "
        "user runs, nothing set per model, GPU or run (the same report as `fairsim-sim2real`).",
        body=body.strip(),
    )


def main(argv: list[str] | None = None) -> None:
    run_command("fairsim-validation", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=20, help="runs per experiment (>= 2)")
    parser.add_argument("--out", default="docs/validation.md", help="the report (Markdown)")
    parser.add_argument(
        "--section",
        action="append",
        choices=SECTIONS,
        help="only these sections (default: all); into an existing --out, the other sections stay",
    )
    parser.add_argument("--table", action="append", help="only these VTC tables (2, 3, 4, 5, 6)")
    parser.add_argument("--jobs", type=int, help="processes at once (default: one per CPU)")
    args = parser.parse_args(argv)
    n = args.replications
    if n < 2:
        raise ConfigError(f"--replications must be >= 2, got {n}")
    chosen = args.section or SECTIONS
    if args.table and "vtc-tables" not in chosen:
        raise ConfigError(
            f"--table chooses VTC tables, which only the vtc-tables section has; the sections "
            f"chosen: {', '.join(chosen)}; add --section vtc-tables or leave --table out"
        )
    plans = []
    if "vtc-tables" in chosen:
        plans.append(vtc_tables_section(n, args.table))
    if "vtc-suites" in chosen:
        plans.append(vtc_suites_section(n))
    if "fairserve" in chosen:
        plans.append(fairserve_section(n))
    tasks = [t for plan_tasks, _ in plans for t in plan_tasks]
    results = run_all(tasks, args.jobs or os.cpu_count() or 1) if tasks else {}
    sections = [build(results) for _, build in plans]
    if "etalon" in chosen:
        sections.append(etalon_section())
    if "sim2real" in chosen:
        measured = sim2real_section(explicit=bool(args.section), folder=Path(args.out).parent)
        sections += [measured] if measured else []
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["fairsim-validation", *given])
    report = render(sections, n, command)
    if Path(args.out).exists():
        chosen_titles = [s.title for s in sections] if args.section else None
        report = merge_into(Path(args.out).read_text(), report, chosen_titles)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(Path(args.out), report.rstrip("\n") + "\n")
    every = [f for s in sections for f in s.findings]
    print(f"{args.out}: {len(every)} published numbers: {_counts(every)}")
    for f in every:
        if f.verdict == "out":
            print(f"  out: {f.what}: published {_published(f.published, f.decimals)}, "
                  f"simulated {_interval(f.values, 2 if f.decimals > 0 else 0)}")  # fmt: skip
