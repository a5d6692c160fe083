"""Capacity search drivers (docs/metrics.md §6): the highest load that still meets an SLO.

Each driver is a pure function of a `check` (or `measure`) callable, so it is tested against
analytic pass/fail functions and runs unchanged on the simulator (simulator/capacity_run.py).
- `etalon_search`: Etalon's adaptive bisection over a float QPS (or an integer, e.g. users).
- `evalscope_search`: EvalScope's SLA auto-tune over an integer knob, one search per criteria
  group, with its extremum (`max`/`min`) mode.
- `veeksha_search`: Veeksha's exponential probe then integer bisection (floats via 10^precision).
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from simulator.core.errors import ConfigError

Metrics = dict[str, float]
Check = Callable[[float], tuple[bool, Metrics]]  # value -> (passed, what was measured)
Measure = Callable[[int], Metrics]  # value -> averaged metrics incl. success_rate

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
# the metrics an EvalScope criterion may name (its SLA_METRIC_FIELDS) and the unit EvalScope's
# report gives each in: a bare threshold is read in it (EvalScope 1.14.1). Each probe measures
# them (SimulatedService), with its success rate, which is no criterion.
EVALSCOPE_UNITS = {
    "avg_latency": "s", "p99_latency": "s",
    "avg_ttft": "ms", "p50_ttft": "ms", "p90_ttft": "ms", "p99_ttft": "ms",
    "avg_tpot": "ms", "p50_tpot": "ms", "p90_tpot": "ms", "p99_tpot": "ms",
    "rps": "req/s", "tps": "tok/s",
}  # fmt: skip
EVALSCOPE_METRICS = tuple(EVALSCOPE_UNITS)
# fairsim's steady-state mode: every time in seconds
STEADY_STATE_UNITS = {k: "s" if u == "ms" else u for k, u in EVALSCOPE_UNITS.items()}
SECONDS_PER = {"s": 1.0, "ms": 0.001}  # the time units a threshold may carry
# EvalScope reads these signs as their ASCII operators (and drops thin spaces)
UNICODE_OPERATORS = {"≤": "<=", "≥": ">=", "≧": ">=", "\u2009": ""}
CRITERION = re.compile(
    r"^(<=|>=|<|>)\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z/%]*)$"
)
ETALON_STOP_FRACTION = 0.025
ETALON_GROW_FRACTION = 0.8


@dataclass(frozen=True)
class Probe:
    value: float
    passed: bool
    metrics: Metrics = field(default_factory=dict)


@dataclass
class SearchResult:
    criteria: str
    variable: str
    best_value: float | None
    note: str
    history: list[Probe] = field(default_factory=list)


def etalon_search(
    check: Check, start: float, max_iterations: int = 20, decimals: int = 2
) -> SearchResult:
    """left = 0, right = 2 start; probe round((left + right) / 2, decimals); a pass above 80% of
    right doubles right (capped by the smallest failure); stop when the bracket is within 2.5% of
    the last probe, when a probe repeats, or after `max_iterations` probes. Etalon rounds QPS to
    2 decimals; `decimals=0` searches the integers (a number of concurrent users)."""
    if not start > 0:
        raise ConfigError(f"capacity.start must be > 0, got {start}")
    left, right = 0.0, 2.0 * start
    smallest_fail = math.inf
    best: float | None = None
    history: list[Probe] = []
    note = f"stopped after {max_iterations} probes"
    for _ in range(max_iterations):
        if history and abs(left - right) < ETALON_STOP_FRACTION * history[-1].value:
            note = "converged (bracket within 2.5% of the last probe)"
            break
        qps = round((left + right) / 2, decimals) if decimals else round((left + right) / 2)
        if qps <= 0 or any(p.value == qps for p in history):
            note = f"converged (probe repeated at {10.0**-decimals:g} resolution)"
            break
        passed, measured = check(qps)
        history.append(Probe(qps, passed, measured))
        if passed:
            best = qps
            if qps > ETALON_GROW_FRACTION * right:
                right = min(2.0 * right, smallest_fail)
            left = qps
        else:
            smallest_fail = min(smallest_fail, qps)
            right = qps
    if best is None:
        note = "no probed load met the SLO"
    return SearchResult("", "qps", best, note, history)


def veeksha_search(
    check: Check, start: float, precision: int = 0, upper: float | None = None
) -> SearchResult:
    """Double from `start` until the first failure (or `upper`), then integer bisection taking
    the upper middle; values live on a grid of 10^-precision."""
    scale = 10**precision
    v = max(1, round(start * scale))
    cap = math.inf if upper is None else round(upper * scale)
    history: list[Probe] = []

    def probe(x: int) -> bool:
        passed, measured = check(x / scale)
        history.append(Probe(x / scale, passed, measured))
        return passed

    last_pass, first_fail = 0, None
    while first_fail is None:
        if probe(v):
            last_pass = v
            if v >= cap:
                return SearchResult("", "value", v / scale, "passed at the upper bound", history)
            v = int(min(2 * v, cap))
        else:
            first_fail = v
    while first_fail - last_pass > 1:
        mid = (last_pass + first_fail + 1) // 2
        if probe(mid):
            last_pass = mid
        else:
            first_fail = mid
    if last_pass == 0:
        return SearchResult("", "value", None, "failed at the smallest grid value", history)
    return SearchResult("", "value", last_pass / scale, "satisfied", history)


@dataclass(frozen=True)
class Condition:
    metric: str
    op: str  # one of OPERATORS, or "max" / "min"
    threshold: float = math.nan

    def __str__(self) -> str:
        return (
            f"{self.metric} -> {self.op}"
            if self.op in ("max", "min")
            else (f"{self.metric} {self.op} {self.threshold:g}")
        )


def _to_unit(suffix: str, unit: str, group: str, metric: str) -> float:
    """The factor taking a threshold written in `suffix` (none: `unit` itself) to `unit`."""
    if not suffix or suffix == unit:
        return 1.0
    if suffix in SECONDS_PER and unit in SECONDS_PER:
        return SECONDS_PER[suffix] / SECONDS_PER[unit]
    raise ConfigError(
        f"capacity.sla_params[{group}], field '{metric}': unit {suffix!r} does not fit the "
        f"metric, which is in {unit}; accepted: a bare number in {unit}"
        + (", or one ending in s or ms" if unit in SECONDS_PER else "")
    )


def parse_sla_params(
    groups: list[dict[str, str]], units: dict[str, str] = EVALSCOPE_UNITS
) -> list[list[Condition]]:
    """EvalScope's `--sla-params`: a list of groups {metric: "<=2" | "max" | "min", ...}. A
    bare threshold is in the metric's unit (`units`: EvalScope's report units by default); one
    ending in s or ms is converted to it, as EvalScope does."""
    if not isinstance(groups, list) or not groups:
        raise ConfigError(
            f"capacity.sla_params: got {groups!r}; accepted: a non-empty list of "
            'groups such as [{"p99_ttft": "<=2", "avg_tpot": "<0.05"}]'
        )
    out = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or not group:
            raise ConfigError(
                f"capacity.sla_params[{i}]: got {group!r}; accepted: a non-empty "
                "mapping of metric to condition"
            )
        conds = []
        for metric, text in group.items():
            if metric not in EVALSCOPE_METRICS:
                close = difflib.get_close_matches(str(metric), EVALSCOPE_METRICS, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(
                    f"capacity.sla_params[{i}]: unknown metric {metric!r}{hint}; accepted: "
                    + ", ".join(EVALSCOPE_METRICS)
                )
            text = str(text).strip()
            for sign, ascii_sign in UNICODE_OPERATORS.items():
                text = text.replace(sign, ascii_sign)
            if text in ("max", "min"):
                conds.append(Condition(str(metric), text))
                continue
            m = CRITERION.match(text)
            if m is None or not math.isfinite(float(m.group(2))):
                raise ConfigError(
                    f"capacity.sla_params[{i}], field '{metric}': got {text!r}; "
                    "accepted: <=, >=, <, > followed by a number (and s or ms for a time), "
                    "or max / min"
                )
            threshold = float(m.group(2)) * _to_unit(m.group(3), units[metric], f"{i}", metric)
            conds.append(Condition(str(metric), m.group(1), threshold))
        if any(c.op in ("max", "min") for c in conds) and (len(conds) > 1 or len(groups) > 1):
            raise ConfigError(
                f"capacity.sla_params[{i}]: max/min must be the only criterion of "
                "the only group (EvalScope's extremum mode)"
            )
        out.append(conds)
    return out


def evalscope_search(
    measure: Measure,
    group: list[Condition],
    start: int,
    lower: int = 1,
    upper: int = 1024,
    variable: str = "rate",
) -> SearchResult:
    """One EvalScope search for one criteria group (conditions ANDed; a point also fails unless
    every request succeeded). Extremum mode when the group is a single max/min criterion."""
    if not 1 <= lower <= start <= upper:
        raise ConfigError(
            f"capacity: need 1 <= lower <= start <= upper; got {lower}, {start}, {upper}"
        )
    history: list[Probe] = []
    criteria = " AND ".join(str(c) for c in group)
    seen: dict[int, Metrics] = {}

    def metrics_at(v: int) -> Metrics:
        if v not in seen:
            seen[v] = measure(v)
        return seen[v]

    def passes(v: int) -> bool:
        m = metrics_at(v)
        ok = m.get("success_rate", 1.0) >= 1.0 and all(
            c.metric in m and OPERATORS[c.op](m[c.metric], c.threshold) for c in group
        )
        history.append(Probe(v, ok, m))
        return ok

    if group[0].op in ("max", "min"):
        return _extremum(metrics_at, group[0], start, lower, upper, variable, history)
    last_pass: int | None = None
    first_fail: int | None = None
    if passes(start):  # double until the first failure or the upper bound
        last_pass = v = start
        while v < upper and first_fail is None:
            nxt = min(2 * v, upper)
            if passes(nxt):
                last_pass = v = nxt
            else:
                first_fail = nxt
    else:  # halve until a pass or the lower bound
        first_fail = v = start
        while v > lower and last_pass is None:
            nxt = max(v // 2, lower)
            if passes(nxt):
                last_pass = nxt
            else:
                first_fail = v = nxt
    if last_pass is None:
        return SearchResult(criteria, variable, None, f"Failed at lower bound ({lower})", history)
    if first_fail is None:
        return SearchResult(criteria, variable, last_pass, "Reached upper bound", history)
    while first_fail - last_pass > 1:
        mid = (last_pass + first_fail) // 2
        if passes(mid):
            last_pass = mid
        else:
            first_fail = mid
    return SearchResult(criteria, variable, last_pass, "Satisfied", history)


def _extremum(
    metrics_at: Callable[[int], Metrics],
    cond: Condition,
    start: int,
    lower: int,
    upper: int,
    variable: str,
    history: list[Probe],
) -> SearchResult:
    """Double while the metric strictly improves, then shrink the bracket around the best point
    (on a unimodal metric this finds the peak)."""
    sign = 1.0 if cond.op == "max" else -1.0

    def score(v: int) -> float:
        m = metrics_at(v)
        value = sign * m[cond.metric] if m.get("success_rate", 1.0) >= 1.0 else -math.inf
        history.append(Probe(v, True, m))
        return value

    best, best_score = start, score(start)
    lo, hi = lower, upper
    while best < upper:
        nxt = min(2 * best, upper)
        s = score(nxt)
        if s > best_score:
            lo, best, best_score = best, nxt, s
        else:
            hi = nxt
            break
    while hi - lo > 2:
        x = (best + hi) // 2 if hi - best >= best - lo else (lo + best) // 2
        s = score(x)
        if s > best_score:
            lo, hi = (best, hi) if x > best else (lo, best)
            best, best_score = x, s
        elif x > best:
            hi = x
        else:
            lo = x
    note = f"Best {cond.metric}: {sign * best_score:.4f}"
    return SearchResult(str(cond), variable, best, note, history)


def results_table(results: list[SearchResult]) -> str:
    """EvalScope's summary table: Criteria | Variable | Max Satisfied | Note."""
    rows = [("Criteria", "Variable", "Max Satisfied", "Note")]
    rows += [
        (
            r.criteria,
            r.variable,
            f"{r.best_value:g}" if r.best_value is not None else "None",
            r.note,
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line]
    for k, row in enumerate(rows):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if k == 0:
            out.append(line.replace("-", "="))
    out.append(line)
    return "\n".join(out)
