"""`fairsim-calibrate RUN`: fit the linear step-cost model to a measured run (fairsim-bench's
run folder) from client-side token times alone, and write a `cost_model` config `fairsim` runs.

Steps are inferred from the bursts of tokens (`simulator/metrics/step_inference.py`); each
usable step's duration is then a linear function of what it did (`cost_models/linear.py`):

    prefill step: step_overhead + prefill_per_request * n + prefill_per_token * prompt tokens
    decode step:  step_overhead + decode_base + decode_per_seq * b + decode_per_context_token * ctx

and a step doing both costs both, one overhead (as `mixed_step_time` prices it). A burst
also reaches the client later the more tokens it holds (the server writes each, the client
reads each, a new stream's headers first), and a measured duration is its burst's delay less
the previous one's; two delay terms take that up, so it is not read as cost:

    + delay_per_decode_token * (decodes - previous burst's decodes)
    + delay_per_first_token * (prefills - previous burst's prefills)

The fit is non-negative robust least squares (soft L1 beyond 1 ms: a delayed packet is an
outlier, not a slower step). A term the run cannot tell apart (e.g. decode_base when no step is
prefill-only) is fixed at 0 and said so.

Output (default RUN/calibration/): cost_model/calibrated.yaml, calibration.json (parameters,
residuals, steps used), steps.parquet (the inferred steps) and fit.png (measured against
predicted step times). `fairsim --config-dir RUN/calibration cost_model=calibrated` runs it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares, nnls

from cost_models import LinearStepCost
from cost_models.base import CostModelError
from simulator.apps.common.command import run_command
from simulator.core.errors import ConfigError
from simulator.metrics.step_inference import default_gap, infer_steps
from simulator.report.run_folder import (
    IncompleteRunError,
    MalformedRunError,
    load_run,
    write_text_atomically,
)

PARAMETERS = (
    "step_overhead",
    "decode_base",
    "decode_per_seq",
    "decode_per_context_token",
    "prefill_per_request",
    "prefill_per_token",
)
# what the measurement adds to a step's duration: how much later a burst arrives per decode
# token and per first token it holds than the burst before (seconds on the run's clock)
DELAY_TERMS = ("delay_per_decode_token", "delay_per_first_token")
TERMS = PARAMETERS + DELAY_TERMS
MIN_STEPS = 3  # usable steps with prefills, and with decodes, a fit needs at the least
ROBUST_SCALE = 1e-3  # seconds: residuals beyond this count linearly (soft L1)


def design(steps: pd.DataFrame) -> np.ndarray:
    """Each step's features, one column per TERMS entry (`steps` in time order: a row's delay
    terms compare it with the row before)."""
    decodes = steps["decodes"].to_numpy(dtype=np.float64)
    prefills = steps["prefills"].to_numpy(dtype=np.float64)
    return np.column_stack(
        [
            np.ones(len(steps)),
            (decodes > 0).astype(np.float64),
            decodes,
            steps["context"].to_numpy(dtype=np.float64),
            prefills,
            steps["prompt_tokens"].to_numpy(dtype=np.float64),
            np.diff(decodes, prepend=0.0),
            np.diff(prefills, prepend=0.0),
        ]
    )


def fit(steps: pd.DataFrame) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """The parameters of the usable steps, their standard errors, and the ones fixed at 0
    because the run cannot identify them.

    The standard errors are the robust fit's sandwich estimate, B^-1 M B^-1 with
    B = A' diag(psi'(r)) A and M = A' diag(psi(r)^2) A (psi the soft-L1 loss's derivative):
    it holds when the noise grows with the step (a GPU's jitter is proportional), and a
    delayed packet counts only as much as the loss lets it."""
    usable = steps["usable"].to_numpy()
    x = design(steps)[usable]
    y = steps["duration"].to_numpy()[usable]
    scale = np.abs(x).max(axis=0)
    free = [j for j in range(x.shape[1]) if scale[j] > 0]
    # drop columns that add nothing the others do not already explain (e.g. decode_base when
    # every step decodes: then it equals the overhead's column)
    kept: list[int] = []
    for j in free:
        trial = x[:, [*kept, j]] / scale[[*kept, j]]
        if np.linalg.matrix_rank(trial, tol=1e-9 * len(y)) == len(kept) + 1:
            kept.append(j)
    if len(y) < 2 * len(kept) + 2:
        raise ConfigError(
            f"only {len(y)} usable steps; fairsim-calibrate needs a longer or busier run"
        )
    a = x[:, kept] / scale[kept]
    start, _ = nnls(a, y)
    result = least_squares(
        lambda p: a @ p - y,
        np.maximum(start, 1e-12),
        bounds=(0.0, np.inf),
        loss="soft_l1",
        f_scale=ROBUST_SCALE,
    )
    z = 1 + ((a @ result.x - y) / ROBUST_SCALE) ** 2
    psi, psi_slope = (a @ result.x - y) / np.sqrt(z), z**-1.5
    bread = np.linalg.pinv(a.T @ (psi_slope[:, None] * a))
    errors = np.sqrt(np.diag(bread @ (a.T @ (psi[:, None] ** 2 * a)) @ bread))
    values = dict.fromkeys(TERMS, 0.0)
    standard_errors = dict.fromkeys(TERMS, 0.0)
    for j, v, e in zip(kept, result.x / scale[kept], errors / scale[kept]):
        values[TERMS[j]] = float(v)
        standard_errors[TERMS[j]] = float(e)
    fixed = [TERMS[j] for j in range(len(TERMS)) if j not in kept]
    return values, standard_errors, fixed


def predict(values: dict[str, float], steps: pd.DataFrame) -> np.ndarray:
    """Each step's measured duration as the fit explains it: its cost and the burst delay."""
    return design(steps) @ np.array([values[p] for p in TERMS])


def calibrate(run: Path, out: Path, gap: float | None = None) -> dict[str, Any]:
    try:
        outputs = load_run(run)
    except (IncompleteRunError, MalformedRunError) as err:
        raise ConfigError(str(err)) from None
    requests, tokens = outputs.requests, outputs.tokens
    assert tokens is not None  # load_run reads every table
    completed = requests[requests["status"] == "completed"]
    tokens = tokens[tokens["request_id"].isin(completed["request_id"])]
    try:
        gap = default_gap(tokens) if gap is None else gap
    except ValueError as err:
        raise ConfigError(f"{run}: {err}") from None
    steps = infer_steps(completed, tokens, gap)
    used = steps[steps["usable"]]
    prefills, decodes = int((used.prefills > 0).sum()), int((used.decodes > 0).sum())
    if min(prefills, decodes) < MIN_STEPS:
        raise ConfigError(
            f"{run}: {prefills} usable steps with prefills and {decodes} with decodes; "
            f"fitting both needs {MIN_STEPS} of each: measure a longer or busier run, where "
            "requests arrive while others decode"
        )
    values, standard_errors, fixed = fit(steps)
    cost = {name: values[name] for name in PARAMETERS}
    try:
        LinearStepCost(**cost)
    except CostModelError as err:
        raise ConfigError(f"{run}: the fit is not a usable cost model ({err})") from None
    steps["predicted"] = predict(values, steps)
    used = steps[steps["usable"]]
    residual = (used["duration"] - used["predicted"]).to_numpy()
    report = {
        "run": str(run),
        "gap": gap,
        "parameters": cost,
        "burst_delay": {name: values[name] for name in DELAY_TERMS},
        "standard_errors": standard_errors,
        "fixed_at_zero": fixed,
        "steps": {
            "inferred": len(steps),
            "used": len(used),
            "prefill_only": int(((used.prefills > 0) & (used.decodes == 0)).sum()),
            "decode_only": int(((used.decodes > 0) & (used.prefills == 0)).sum()),
            "mixed": int(((used.decodes > 0) & (used.prefills > 0)).sum()),
        },
        "residual_seconds": {
            "median_abs": float(np.median(np.abs(residual))),
            "p99_abs": float(np.percentile(np.abs(residual), 99)),
        },
    }
    write_outputs(out, cost, report, steps)
    return report


def write_outputs(
    out: Path, values: dict[str, float], report: dict[str, Any], steps: pd.DataFrame
) -> None:
    (out / "cost_model").mkdir(parents=True, exist_ok=True)
    header = (
        f"# Fitted by fairsim-calibrate to the measured run {report['run']} "
        f"({report['steps']['used']} steps; median |residual| "
        f"{1e3 * report['residual_seconds']['median_abs']:.2f} ms).\n"
    )
    body = {"_target_": "cost_models.LinearStepCost", **values}
    text = header + yaml.safe_dump(body, sort_keys=False)
    write_text_atomically(out / "cost_model" / "calibrated.yaml", text)
    write_text_atomically(out / "calibration.json", json.dumps(report, indent=2) + "\n")
    steps.to_parquet(out / "steps.parquet", index=False)
    plot_fit(steps[steps["usable"]], out / "fit.png")


def plot_fit(used: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    kinds = np.where(used.prefills == 0, "decode", np.where(used.decodes == 0, "prefill", "mixed"))
    for kind in ("decode", "prefill", "mixed"):
        sel = kinds == kind
        if sel.any():
            ax.scatter(1e3 * used.predicted[sel], 1e3 * used.duration[sel], s=6, label=kind)
    top = 1e3 * float(max(used.duration.max(), used.predicted.max()))
    ax.plot([0, top], [0, top], color="gray", linewidth=0.8)
    ax.set_xlabel("predicted step time (ms)")
    ax.set_ylabel("measured step time (ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_report(report: dict[str, Any], out: Path) -> str:
    s = report["steps"]
    lines = [
        f"fairsim-calibrate: {s['used']} of {s['inferred']} inferred steps used "
        f"({s['prefill_only']} prefill, {s['decode_only']} decode, {s['mixed']} mixed; "
        f"burst gap {1e3 * report['gap']:.2f} ms)",
    ]

    def term(name: str, v: float) -> str:
        if name in report["fixed_at_zero"]:
            return f"  {name:<26}{v:.4g}  (fixed: the run cannot tell it apart)"
        return f"  {name:<26}{v:.4g} ± {report['standard_errors'][name]:.2g}"

    lines += [term(name, v) for name, v in report["parameters"].items()]
    lines.append("the measurement's delay (how much later a burst came per token it held):")
    lines += [term(name, v) for name, v in report["burst_delay"].items()]
    r = report["residual_seconds"]
    lines.append(
        f"residual |measured - predicted|: median {1e3 * r['median_abs']:.2f} ms, "
        f"p99 {1e3 * r['p99_abs']:.2f} ms"
    )
    lines.append(f"run it: fairsim --config-dir {out} cost_model=calibrated")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="fairsim-calibrate",
        description="Fit the linear step-cost model to a measured run (fairsim-bench's folder).",
    )
    parser.add_argument("run", type=Path, help="a measured run folder")
    parser.add_argument("--out", type=Path, help="output folder (default RUN/calibration)")
    parser.add_argument(
        "--gap", type=float, help="seconds between two steps' token bursts (default: inferred)"
    )
    args = parser.parse_args(argv)

    def job() -> None:
        out = args.out or args.run / "calibration"
        print(format_report(calibrate(args.run, out, args.gap), out))

    run_command("fairsim-calibrate", job)
