"""`fairsim-fit`: fit the fitted cost model's global coefficients to measured training runs and
write the coefficient file with its provenance.

The coefficients enter step times, and step times shape the batches, so the fit alternates:
simulate every training run with the current coefficients; express each stage's mean E2E and
mean TTFT as linear in them (a request's latency = the front end's fixed latency + its steps x
the model's reference step under the current iterate + the time before the first whole step it waits
for + the sum of the steps it spans, each step's time = coefficients x its physics terms,
`FittedCost.term_matrix`); solve for non-negative coefficients that minimise the relative
errors; repeat until they settle. Only the runs named in `TRAINING` are read, and
of those the ones without failed requests (runs where clients gave up: the fit was made before
fairsim modelled clients' timeouts, and is kept as it was made).

    fairsim-fit --runs DIR [--out cost_models/data/fitted/coefficients.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from cost_models.fitted import SHIPPED, TERMS, FittedCost, read_coefficients
from simulator.api import build_trace, compose_config, instantiate_parts
from simulator.apps.common.command import run_command
from simulator.apps.sim2real.runs import (
    TRAINING,
    MeasuredRun,
    experiment_overrides,
    load_runs,
)
from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED
from simulator.core.timeline import Timeline
from simulator.engines import simulate

FITTED_METRICS = ("e2e_mean", "ttft_mean")  # the measured ITL counts output tokens unreliably
START = {  # where the iteration starts: the roofline's memory (0.8) and compute (0.6)
    # efficiencies and its step overhead
    "weights": 1 / 0.8,
    "matmul": 1 / 0.6,
    "attention": 1 / 0.8,
    "allreduce": 1.0,
    "allreduce_calls": 10e-6,
    "requests": 0.0,
    "step": 0.002,
}


# The prior each coefficient is held near, (centre, scale): START, and for the per-request term
# (START 0) 20 us, a typical Python-side cost per sequence per step
PRIOR = {k: (v, v) for k, v in START.items()} | {"requests": (0.0, 20e-6)}
PRIOR_WEIGHT = 0.1  # how strongly (relative to a 100% error on one stage's mean)
DAMPING = 0.5


@dataclass(frozen=True)
class RecordedCost(FittedCost):
    """The fitted model, noting the inputs of every step it times (the fit runs without
    fast-forward, so each call is one step of the run, in order)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "calls", [])

    def one_step(self, tokens: int, requests: int, kv_tokens: float, pairs: float) -> float:
        self.calls.append((tokens, requests, kv_tokens, pairs))  # type: ignore[attr-defined]
        return super().one_step(tokens, requests, kv_tokens, pairs)

    def decode_times(self, batch_size: int, context_tokens: np.ndarray) -> np.ndarray:
        raise AssertionError("the fit simulates with fast-forward off")


def stage_rows(
    timeline: Timeline, cost: RecordedCost, run: MeasuredRun
) -> list[tuple[np.ndarray, float, float]]:
    """Per stage and fitted metric: (mean terms over requests, the part of the mean that is
    not a step, the measured value); the simulated mean is frontend + rest + coefficients x
    terms."""
    steps = timeline.steps_frame()
    start, end = steps["start"].to_numpy(), steps["end"].to_numpy()
    calls = np.array(cost.calls, dtype=np.float64)  # type: ignore[attr-defined]
    if calls.shape[0] != start.shape[0]:
        raise RuntimeError(f"{run.name}: {calls.shape[0]} step timings for {start.shape[0]} steps")
    x = cost.term_matrix(calls[:, 0], calls[:, 1], calls[:, 2], calls[:, 3])
    cum = np.vstack([np.zeros(len(TERMS)), np.cumsum(x, axis=0)])
    dur = np.concatenate([[0.0], np.cumsum(end - start)])
    frontend = float(cost.frontend_latency)  # type: ignore[attr-defined]
    done = timeline.status == COMPLETED
    sent = timeline.arrival
    rows = []
    since = 0.0
    for until, measured in zip(run.stage_ends, run.stages, strict=True):
        mine = done & (sent >= since) & (sent < until)
        since = until
        if not mine.any():
            continue
        queued = sent[mine] + frontend
        lo = np.searchsorted(start, queued, side="left")
        for metric, at in (
            ("e2e_mean", timeline.finished_at),
            ("ttft_mean", timeline.first_token_at),
        ):
            hi = np.searchsorted(end, at[mine], side="right")
            hi = np.maximum(hi, lo)
            terms = cum[hi] - cum[lo]
            rest = (at[mine] - queued) - (dur[hi] - dur[lo])
            rows.append((terms.mean(axis=0), float(rest.mean()), measured[metric]))
    return rows


def _bounded(old: float, new: float) -> float:
    if old <= 0:
        return new
    return min(max(new, old / 2), old * 2)


def fit(runs: list[MeasuredRun], iterations: int = 12) -> dict[str, Any]:
    """The coefficients and front-end latency the training runs give, and how the fit went."""
    chosen = [r for r in runs if r.training and not r.overloaded]
    if not chosen:
        raise ConfigError("no training run without failed requests among the runs given")
    beta, frontend, frontend_steps = dict(START), 0.0, 0.0
    history: list[dict[str, float]] = []
    best: tuple[float, dict[str, float], float, float] | None = None
    for _ in range(iterations):
        a_rows, b = [], []
        for run in chosen:
            cfg = compose_config([*experiment_overrides(run), "engine.fast_forward=false"])
            policy, shipped, engine, cluster = instantiate_parts(cfg)
            assert isinstance(shipped, FittedCost)
            fields = {f.name: getattr(shipped, f.name) for f in dataclasses.fields(shipped)}
            cost = RecordedCost(**fields)
            cost._use(beta, frontend, frontend_steps)  # this iterate's coefficients
            reference = float(cost.reference_step)  # type: ignore[attr-defined]
            timeline = simulate(build_trace(cfg), policy, cost, engine, cluster)
            for terms, rest, measured in stage_rows(timeline, cost, run):
                # relative error rows: the step terms, the front end's fixed part, its steps
                a_rows.append(np.append(terms, [1.0, reference]) / measured)
                b.append(1.0 - rest / measured)
        data, target = np.array(a_rows), np.array(b)
        # this iterate's own relative errors, as simulated (the rows are exact at it)
        errors = data @ np.array([*(beta[k] for k in TERMS), frontend, frontend_steps]) - target
        score = float(errors @ errors)
        if best is None or score < best[0]:
            best = (score, dict(beta), frontend, frontend_steps)
        prior = np.zeros((len(TERMS), len(TERMS) + 2))
        for k, term in enumerate(TERMS):  # the prior: the roofline's own assumptions
            prior[k, k] = PRIOR_WEIGHT / PRIOR[term][1]
        centre = np.array([PRIOR_WEIGHT * PRIOR[t][0] / PRIOR[t][1] for t in TERMS])
        solution, _ = nnls(np.vstack([data, prior]), np.concatenate([target, centre]))
        step = {k: float(v) for k, v in zip(TERMS, solution[:-2], strict=True)}
        # part of a step at a time, each coefficient at most doubled or halved: batches answer to
        # step times, which the linear model holds fixed
        new = {k: _bounded(beta[k], beta[k] + DAMPING * (step[k] - beta[k])) for k in TERMS}
        frontend += DAMPING * (float(solution[-2]) - frontend)
        frontend_steps += DAMPING * (float(solution[-1]) - frontend_steps)
        change = max(abs(new[k] - beta[k]) / PRIOR[k][1] for k in TERMS)
        history.append({"squared_relative_error": round(score, 6), "change": round(change, 6)})
        beta = new
        if change < 1e-3:
            break
    assert best is not None
    _, beta, frontend, frontend_steps = best  # the iterate whose simulation came closest
    return {
        "coefficients": beta,
        "frontend_latency": frontend,
        "frontend_steps": frontend_steps,
        "runs": [r.name for r in chosen],
        "iterations": history,
    }


def main(argv: list[str] | None = None) -> None:
    run_command("fairsim-fit", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="a folder of measured run folders")
    parser.add_argument("--out", default=str(SHIPPED), help="the coefficient file to write")
    args = parser.parse_args(argv)
    runs = load_runs(args.runs)
    result = fit(runs)
    out = {
        "coefficients": result["coefficients"],
        "frontend_latency": result["frontend_latency"],
        "frontend_steps": result["frontend_steps"],
        "provenance": {
            "command": "fairsim-fit --runs DIR",
            "fitted_on": result["runs"],
            "training_set": list(TRAINING),
            "metrics": list(FITTED_METRICS),
            "iterations": result["iterations"],
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    read_coefficients(args.out)  # the file reads back
    shown = ("coefficients", "frontend_latency", "frontend_steps")
    print(json.dumps({k: out[k] for k in shown}, indent=2))
    print(f"fairsim-fit: wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
