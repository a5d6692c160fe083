"""Capacity search on the simulator: the Python API and the `fairsim-capacity` command.

The knob (`capacity.variable`) is either
- `rate`, the workload's mean arrival rate in requests/s (open loop): a probe at rate q runs the
  configured synthetic workload with rate_scale = q / (its configured rate at scale 1), over
  `capacity.num_requests / q` seconds when `num_requests` is set (Etalon's fixed-size runs) or
  the workload's own duration otherwise; or
- `concurrency`, the number of users of a closed loop (traces.ClosedLoop): each user sends its
  next request when the previous one ends, `capacity.num_requests` requests in all. A synthetic
  workload is wrapped (its clients give the users' lengths, `capacity.think_time` their think
  time); a ClosedLoop workload keeps its own settings and only its `users` change.
Every probe runs to completion. Etalon and Veeksha modes pass a probe when every SLO in `slos`
is met; EvalScope mode judges its own criteria groups on metrics averaged over `num_runs` seeds.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

from simulator.api.prefill_profile import profile_prefill
from simulator.api.run import config_slos, instantiate_parts, what_ran, with_client_timeout
from simulator.apps.capacity.searches import (
    EVALSCOPE_UNITS,
    STEADY_STATE_UNITS,
    SearchResult,
    etalon_search,
    evalscope_search,
    parse_sla_params,
    results_table,
    veeksha_search,
)
from simulator.apps.common import hydra_jobs
from simulator.core.errors import ConfigError
from simulator.core.requests import CLIENT_TIMEOUT
from simulator.engines import simulate
from simulator.metrics import latency
from simulator.metrics.prefill_curve import fit_prefill_curve
from simulator.metrics.qoe import QoEConfig, request_values
from simulator.metrics.slo import evaluate_slos
from simulator.report.pictures import run_title, save_png
from simulator.report.run_folder import json_safe
from traces.closed_loop import ClosedLoop
from traces.schema import Trace
from traces.synthetic import SyntheticWorkload

MODES = ("etalon", "evalscope", "steady_state", "veeksha")
VARIABLES = {"rate": "arrival rate (requests/s)", "concurrency": "concurrent users"}
# EvalScope's defaults (its SLA auto-tune arguments): the knob's upper bound when capacity.upper
# is null, and requests per test point per unit of the knob
EVALSCOPE_UPPER = 65536
EVALSCOPE_MULTIPLIER = 2.0


class SimulatedService:
    """Runs the configured policy, engine and workload at a given load (rate or users)."""

    def __init__(self, cfg: DictConfig) -> None:
        cap = cfg.capacity
        self.variable = cap.get("variable", "rate")
        if self.variable not in VARIABLES:
            raise ConfigError(
                f"capacity.variable: got {self.variable!r}; accepted: {tuple(VARIABLES)}"
            )
        self.num_requests = cap.get("num_requests")
        self.workload = self._workload(instantiate(cfg.workload, _convert_="all"), cap)
        self.cfg = cfg
        _, self.cost, self.engine, self.cluster = instantiate_parts(cfg)
        self.qoe: QoEConfig = instantiate(cfg.qoe, _convert_="all")
        self.curve = (
            fit_prefill_curve(profile_prefill(self.cost, self.engine))
            if self.qoe.ttft_deadline is None
            else None
        )
        self.slos = config_slos(cfg)
        self._evalscope_rng: np.random.RandomState | None = None  # see _client_rng

    def _workload(self, workload: Any, cap: DictConfig) -> SyntheticWorkload | ClosedLoop:
        kind = type(workload).__name__
        if self.variable == "rate":
            if not isinstance(workload, SyntheticWorkload):
                raise ConfigError(
                    "capacity.variable=rate needs an open-loop synthetic workload "
                    f"(traces.SyntheticWorkload); got {kind} (closed loops: "
                    "capacity.variable=concurrency)"
                )
            return dataclasses.replace(workload, rate_scale=1.0)
        if isinstance(workload, ClosedLoop):
            if self.num_requests:
                workload = dataclasses.replace(workload, num_requests=int(self.num_requests))
            return workload
        if not isinstance(workload, SyntheticWorkload):
            raise ConfigError(
                "capacity.variable=concurrency needs a traces.SyntheticWorkload or "
                f"traces.ClosedLoop workload; got {kind}"
            )
        if not self.num_requests:
            raise ConfigError("capacity.variable=concurrency needs capacity.num_requests >= 1")
        return ClosedLoop(
            workload,
            users=1,
            num_requests=int(self.num_requests),
            think_time=float(cap.get("think_time", 0.0)),
            name=f"{workload.name} (closed loop)",
        )

    def trace(self, value: float, seed: int) -> Trace:
        """The workload at load `value`: an arrival rate, or a number of users."""
        if isinstance(self.workload, ClosedLoop):
            users = int(value)
            if users != value or users < 1:
                raise ConfigError(f"concurrency must be an integer >= 1, got {value}")
            if users > self.workload.num_requests:
                raise ConfigError(
                    f"concurrency {users} exceeds the {self.workload.num_requests} requests per "
                    "probe; raise capacity.num_requests"
                )
            return dataclasses.replace(self.workload, users=users).build(seed)
        if not value > 0:
            raise ConfigError(f"arrival rate must be > 0, got {value}")
        base = self.workload  # at rate_scale 1
        duration = self.num_requests / value if self.num_requests else base.duration
        scale = value / base.configured_rate()
        return dataclasses.replace(base, rate_scale=scale, duration=duration).build(seed)

    def _client_rng(self, seed: int) -> np.random.Generator | np.random.RandomState:
        """Where a rate point's gaps come from: with `capacity.client_seed` (EvalScope's
        --seed), one legacy numpy stream seeded once and drawn point after point in the order
        the search probes them, as EvalScope draws them, so that both send at the same times;
        without, a stream of the run's own seed."""
        if self.cfg.capacity.get("client_seed") is None:
            return np.random.default_rng(seed)
        if self._evalscope_rng is None:
            self._evalscope_rng = np.random.RandomState(int(self.cfg.capacity.client_seed))
        return self._evalscope_rng

    def run(self, value: float, seed: int, evalscope: bool = False) -> tuple[Any, Any]:
        trace = self.evalscope_trace(value, seed) if evalscope else self.trace(value, seed)
        trace = with_client_timeout(trace, self.cfg)
        policy = instantiate(self.cfg.policy, _convert_="all")
        timeline = simulate(trace, policy, self.cost, self.engine, self.cluster)
        return timeline.requests_frame(), timeline.tokens_frame()

    def check_slos(self, value: float) -> tuple[bool, dict[str, float]]:
        """Whether a probe meets every SLO (over its completed requests, Veeksha's rule) with
        no client giving up (`client_timeout`): a load whose clients abandon requests is not
        sustained, however fast the rest are served."""
        requests, tokens = self.run(value, int(self.cfg.seed))
        values = request_values(requests, tokens, self.qoe, self.curve)
        res = evaluate_slos(self.slos, values)
        measured = {r["slo_metric_key"]: r["observed_value"] for r in res["results"]}
        gave_up = int((requests.reason == CLIENT_TIMEOUT).sum())
        if gave_up:
            measured["clients_gave_up"] = gave_up
        return bool(res["all_slos_met"]) and not gave_up, measured

    def steady_state_metrics(self, value: float, num_runs: int) -> dict[str, float]:
        """EvalScope's metrics, in seconds and unrounded, of `capacity.num_requests` per run
        (the steady state), averaged over `num_runs` seeds (seed, seed + 1, ...)."""
        seeds = range(int(self.cfg.seed), int(self.cfg.seed) + num_runs)
        runs = [point_metrics(*self.run(value, seed), scale=1.0, rounded=False) for seed in seeds]
        return {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}

    def evalscope_metrics(self, value: float, num_runs: int) -> dict[str, float]:
        """A test point as EvalScope's SLA auto-tune measures it: round(multiplier x value)
        requests per run (`evalscope_trace`), its metrics in its units and rounding (TTFT and
        TPOT in ms), averaged over `num_runs` runs (seeds seed, seed + 1, ...)."""
        seeds = range(int(self.cfg.seed), int(self.cfg.seed) + num_runs)
        runs = [point_metrics(*self.run(value, seed, evalscope=True)) for seed in seeds]
        return {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}

    def evalscope_trace(self, value: float, seed: int) -> Trace:
        """The requests of one EvalScope test point: n = max(1, round(multiplier x value)).
        Users (`concurrency`): `value` slots that each send their next request as soon as the
        last one ends, the first ones `dispatch_gap` apart (EvalScope's client sends them one
        after another). Rate: n requests whose exponential gaps are scaled so that the last is
        sent at n / rate, as EvalScope paces them (no cap on requests in flight: EvalScope's
        default, the upper bound's number of slots)."""
        cap = self.cfg.capacity
        count = max(1, round(value * float(cap.get("number_multiplier", EVALSCOPE_MULTIPLIER))))
        if isinstance(self.workload, ClosedLoop):
            users = min(int(value), count)
            gap = float(cap.get("dispatch_gap", 0.0))
            loop = dataclasses.replace(
                self.workload, users=users, num_requests=count, start_spread=users * gap
            )
            return loop.build(seed)
        base = self.workload
        scale = value / base.configured_rate()
        duration = 2.0 * count / value
        while True:  # long enough to hold `count` requests of the workload's own mix
            trace = dataclasses.replace(base, rate_scale=scale, duration=duration).build(seed)
            if len(trace) >= count:
                break
            duration *= 2
        gaps = self._client_rng(seed).exponential(1.0 / value, size=count)
        sent = np.cumsum(gaps)
        sent *= (count / value) / sent[-1]
        return trace.take(np.arange(count), arrival=sent)


def point_metrics(
    requests: Any, tokens: Any, scale: float = 1000.0, rounded: bool = True
) -> dict[str, float]:
    """EvalScope's summary of one run (its BenchmarkMetrics and percentile table): completed
    requests count, latency from sending to the last token, TPOT = (latency - TTFT) / (tokens
    - 1) (none for one token), percentiles by its rule (`latency.percentile`, "evalscope"), rps
    and tps over the span from the first send to the last completion, and the share of
    requests that completed (`success_rate`, 1 = all). EvalScope reports TTFT and TPOT in ms
    rounded to 2 decimals and the rest rounded to 4 (`scale`, `rounded`); fairsim's steady state
    keeps seconds (`scale=1`), unrounded but for the percentiles' 2 decimals."""
    done = requests[requests.status == "completed"]
    # (a request whose client gave up emitted tokens too: EvalScope counts it as failed)
    lat = latency.per_request_latency(done, latency.tokens_of(tokens, done.request_id), "evalscope")
    lat.loc[lat.tokens < 2, "tpot"] = np.nan  # no decode phase: no TPOT (left out, as EvalScope)
    ended = requests.finished_at.to_numpy(dtype=float)
    span = float(np.nanmax(ended) - requests.arrival.min()) if len(done) else 0.0

    def fixed(value: float, places: int) -> float:
        return round(value, places) if rounded else value

    timed = {"ttft": lat.ttft.to_numpy() * scale, "tpot": lat.tpot.to_numpy() * scale}
    out = {
        "success_rate": len(done) / len(requests),
        "avg_latency": fixed(float(lat.e2e.mean()), 4),
        "p99_latency": latency.percentile(lat.e2e.to_numpy(), 99, "evalscope"),
        "rps": fixed(len(done) / span, 4) if span > 0 else 0.0,
        "tps": fixed(float(done.tokens_emitted.sum()) / span, 4) if span > 0 else 0.0,
    }
    for name, values in timed.items():
        present = values[~np.isnan(values)]
        out[f"avg_{name}"] = fixed(float(present.mean()), 2) if present.size else 0.0
        for p in (50, 90, 99):
            out[f"p{p}_{name}"] = latency.percentile(values, p, "evalscope")
    return out


def check_bounds(cap: DictConfig) -> None:
    """The search's bounds make sense for its mode before anything is probed."""
    start, upper, lower = float(cap.start), cap.get("upper"), int(cap.lower)
    if not start > 0:
        raise ConfigError(f"capacity.start must be > 0, got {cap.start!r}")
    if cap.variable == "concurrency" and not float(start).is_integer():
        raise ConfigError(f"capacity.start must be a whole number of users, got {cap.start!r}")
    if cap.mode == "etalon":
        if upper is not None:
            raise ConfigError(
                "capacity.upper is not used by capacity.mode=etalon (it brackets [0, 2 * start] "
                "and widens it itself); leave it null or use mode=veeksha / evalscope"
            )
        if int(cap.max_iterations) < 1:
            raise ConfigError(f"capacity.max_iterations must be >= 1, got {cap.max_iterations}")
        return
    if upper is not None and float(upper) < start:
        raise ConfigError(f"capacity.upper ({upper}) must be >= capacity.start ({cap.start})")
    if cap.mode == "veeksha" and int(cap.precision) < 0:
        raise ConfigError(f"capacity.precision must be an integer >= 0, got {cap.precision}")
    if cap.mode in ("evalscope", "steady_state"):
        if not 1 <= lower <= start:
            raise ConfigError(f"capacity.lower must be in [1, start={cap.start}], got {lower}")
        if int(cap.num_runs) < 1:
            raise ConfigError(f"capacity.num_runs must be >= 1, got {cap.num_runs}")


def capacity_search(cfg: DictConfig) -> list[SearchResult]:
    """Run the configured search (`capacity.mode`); one result per criteria group."""
    cap = cfg.capacity
    if cap.mode not in MODES:
        raise ConfigError(f"capacity.mode: got {cap.mode!r}; accepted: {MODES}")
    check_bounds(cap)
    service = SimulatedService(cfg)
    if cap.mode in ("evalscope", "steady_state"):
        units = EVALSCOPE_UNITS if cap.mode == "evalscope" else STEADY_STATE_UNITS
        groups = parse_sla_params(OmegaConf.to_container(cap.sla_params), units)  # type: ignore[arg-type]
        num_runs = int(cap.num_runs)
        measure = (
            service.evalscope_metrics if cap.mode == "evalscope" else service.steady_state_metrics
        )
        return [
            evalscope_search(
                lambda v: measure(float(v), num_runs),
                group,
                int(cap.start),
                int(cap.lower),
                int(cap.upper) if cap.get("upper") is not None else EVALSCOPE_UPPER,
                service.variable,
            )
            for group in groups
        ]
    if not service.slos:
        raise ConfigError(f"capacity.mode={cap.mode} needs at least one SLO in `slos`")
    criteria = " AND ".join(
        f"{s.key} {'<=' if s.lower_is_better else '>='} {s.value:g}" for s in service.slos
    )
    integer = service.variable == "concurrency"
    if cap.mode == "etalon":
        result = etalon_search(
            service.check_slos, float(cap.start), int(cap.max_iterations), 0 if integer else 2
        )
    else:
        precision = 0 if integer else int(cap.precision)
        result = veeksha_search(service.check_slos, float(cap.start), precision, cap.get("upper"))
    result.criteria, result.variable = criteria, service.variable
    return [result]


def write_results(
    results: list[SearchResult], folder: str | Path, mode: str, title: str = ""
) -> dict[str, Any]:
    """capacity_search_results.json (best_value, history, one row per group) and a plot of the
    measured metric against the rate."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "mode": mode,
        "variable": results[0].variable,
        "best_value": results[0].best_value,
        "note": results[0].note,
        "history": [dataclasses.asdict(p) for p in results[0].history],
        "groups": [
            {
                "criteria": r.criteria,
                "variable": r.variable,
                "best_value": r.best_value,
                "note": r.note,
                "history": [dataclasses.asdict(p) for p in r.history],
            }
            for r in results
        ],
    }
    (out / "capacity_search_results.json").write_text(json.dumps(json_safe(doc), indent=2) + "\n")
    plot_probes(results, out / "capacity_search.png", title)
    return doc


TERM = re.compile(r"^(\S+) (<=|>=|<|>) (\S+)$")  # a criterion as SearchResult.criteria writes it
MARKERS = ("o", "s", "^", "D", "v", "P")


def metric_unit(metric: str) -> str:
    """The unit of a searched metric's name, for its axis."""
    if any(word in metric for word in ("ttft", "ttfc", "tpot", "tbc", "latency", "e2e")):
        return " (s)"
    return {"rps": " (requests/s)", "tps": " (tokens/s)"}.get(metric, "")


def plot_probes(results: list[SearchResult], path: Path, title: str) -> None:
    """A panel per metric the criteria name: each search's probes against the knob (its own
    colour and marker; filled: passed, hollow: failed) and each criterion's threshold, dashed."""
    terms: dict[str, list[tuple[int, str, float]]] = {}  # metric -> (search, op, threshold)
    for i, r in enumerate(results):
        for text in r.criteria.split(" AND "):
            match = TERM.match(text.strip())
            metric = match.group(1) if match else text.split()[0]
            bound = (i, match.group(2), float(match.group(3))) if match else (i, "", np.nan)
            terms.setdefault(metric, []).append(bound)
    fig = Figure(figsize=(5.5 * max(len(terms), 1), 4))
    axes = fig.subplots(1, max(len(terms), 1), squeeze=False)[0]
    for ax, (metric, bounds) in zip(axes, terms.items(), strict=False):
        for i, op, threshold in bounds:
            r, colour, marker = results[i], f"C{i}", MARKERS[i % len(MARKERS)]
            label = f"search {i + 1}: {r.criteria}"
            probes = sorted((p.value, p.metrics.get(metric, np.nan), p.passed) for p in r.history)
            if probes:
                xs, ys, passed = (np.array(v) for v in zip(*probes, strict=True))
                ax.plot(xs, ys, color=colour, lw=1, alpha=0.6)
                ax.scatter(xs[passed], ys[passed], color=colour, marker=marker, label=label)
                ax.scatter(xs[~passed], ys[~passed], facecolors="none", edgecolors=colour,
                           marker=marker)  # fmt: skip
            if op:
                ax.axhline(threshold, color=colour, linestyle="--", lw=1,
                           label=f"threshold {metric} {op} {threshold:g}")  # fmt: skip
        ax.set_ylabel(metric + metric_unit(metric))
        ax.set_xlabel(VARIABLES.get(results[0].variable, results[0].variable))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"capacity search: probes (filled: passed, hollow: failed)\n{title}", fontsize=9)
    fig.tight_layout()
    save_png(fig, path)


def lower_bound_hints(results: list[SearchResult], cap: DictConfig) -> list[str]:
    """What to try when a search failed at its lower bound (EvalScope searches whole numbers)."""
    hints = []
    for r in results:
        if r.best_value is not None or not r.note.startswith("Failed at lower bound"):
            continue
        if r.variable == "rate":
            hints.append(
                f"fairsim-capacity: {r.criteria} fails even at {int(cap.lower)} request/s, and "
                "EvalScope's knob is a whole number: capacity.variable=concurrency searches "
                "users, capacity.mode=etalon searches rates below 1 request/s"
            )
        else:
            hints.append(
                f"fairsim-capacity: {r.criteria} fails even with {int(cap.lower)} user(s): this "
                "engine cannot meet it at any load (loosen the criterion or change the engine)"
            )
    return hints


# the keys of config.yaml a capacity search never reads, and why
UNREAD = {
    "compare_with": "a capacity search probes loads of one policy: run it once per policy "
    "(a sweep: fairsim-capacity -m policy=vtc,fcfs)",
    **dict.fromkeys(
        ("replications", "replicate_workload", "replication_jobs"),
        "a probe runs once per seed: capacity.num_runs averages EvalScope and steady-state "
        "points over seeds",
    ),
    **dict.fromkeys(
        ("pictures", "veeksha_metrics"),
        "a capacity search writes no run folder per probe: its results are "
        "capacity_search_results.json and capacity_search.png",
    ),
}


# the search settings each mode reads (the others go unread)
MODE_KEYS = {
    "max_iterations": ("etalon",),
    "precision": ("veeksha",),
    "lower": ("evalscope", "steady_state"),
    "num_runs": ("evalscope", "steady_state"),
    "sla_params": ("evalscope", "steady_state"),
    "number_multiplier": ("evalscope",),
    "dispatch_gap": ("evalscope",),
    "client_seed": ("evalscope",),
}


def unread_by_mode(cap: DictConfig) -> dict[str, str]:
    """The settings this search's mode does not read, each with why (EvalScope and
    steady-state searches judge `sla_params`, not `slos` and their QoE deadlines): they get a
    note, not an error (a sweep may vary the mode)."""
    mode = cap.get("mode")
    off = {
        f"capacity.{key}": f"capacity.mode is {mode} (read by {', '.join(modes)})"
        for key, modes in MODE_KEYS.items()
        if mode not in modes
    }
    if mode in ("evalscope", "steady_state"):
        why = f"capacity.mode={mode} judges capacity.sla_params"
        off.update({"slos": why, "qoe.": why})
    return off


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="capacity")
def _main(cfg: DictConfig) -> None:
    out_dir = HydraConfig.get().runtime.output_dir
    hydra_jobs.run_job(
        "fairsim-capacity",
        cfg,
        out_dir,
        lambda: _run(cfg, out_dir),
        unread=UNREAD,
        inert=unread_by_mode(cfg.capacity),
    )


def _run(cfg: DictConfig, out_dir: str) -> None:
    results = capacity_search(cfg)
    write_results(results, out_dir, cfg.capacity.mode, run_title(what_ran(cfg)))
    for r in results:
        print(f"search history ({r.criteria}):")
        for p in r.history:
            print(
                f"  {r.variable} {p.value:g}: {'pass' if p.passed else 'fail'}  "
                + ", ".join(f"{k}={v:.4g}" for k, v in p.metrics.items())
            )
    print(results_table(results))
    for hint in lower_bound_hints(results, cfg.capacity):
        print(hint)
    print(f"results: {out_dir}/capacity_search_results.json")


def main() -> None:
    hydra_jobs.run_hydra_command("fairsim-capacity", _main)
