"""SLOs in Veeksha's form and its `slo_results.json` (docs/metrics.md §6).

An SLO is (metric, percentile, threshold). The observed value is the numpy-linear percentile of
the request-level values (percentile <= 0: the minimum, >= 1: the maximum). It is met when it
equals the threshold (relative 1e-9) or is strictly better; with no data it is not met and the
observed value is inf.

Metrics (seconds unless said): `ttfc` (= TTFT), `tbc` (every decode gap, pooled), `tpot`
(Veeksha's convention), `e2e`, `normalized_e2e`, `miss_rate` (per-request deadline miss rate)
and `fluidity` (higher is better). A fluidity SLO "99% of requests with fluidity >= 0.9" is
written {metric: fluidity, percentile: 0.99, value: 0.9}: the observed value is the fluidity that
99% of requests reach, i.e. the 1st percentile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.core.errors import ConfigError
from simulator.metrics.pooled import WeightedValues

LOWER_IS_BETTER = {
    "ttfc": True,
    "tbc": True,
    "tpot": True,
    "e2e": True,
    "normalized_e2e": True,
    "miss_rate": True,
    "fluidity": False,
}
SLO_FIELDS = ("name", "metric", "percentile", "value", "type")


@dataclass(frozen=True)
class SLO:
    metric: str
    percentile: float
    value: float
    name: str = ""

    @property
    def lower_is_better(self) -> bool:
        return LOWER_IS_BETTER[self.metric]

    @property
    def key(self) -> str:
        return f"{self.metric}_p{100 * self.percentile:g}"


def parse_slos(items: Sequence[Mapping[str, Any]] | None, source: str = "slos") -> list[SLO]:
    """SLOs from config entries; errors name the entry and field and say what is accepted."""
    out = []
    for i, item in enumerate(items or []):
        where = f"{source}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: got {item!r}; accepted: a mapping with {SLO_FIELDS}")
        unknown = set(item) - set(SLO_FIELDS)
        if unknown:
            raise ConfigError(
                f"{where}: unknown field(s) {sorted(unknown)}; accepted: {SLO_FIELDS}"
            )
        metric = item.get("metric")
        if metric not in LOWER_IS_BETTER:
            raise ConfigError(
                f"{where}, field 'metric': got {metric!r}; accepted: {sorted(LOWER_IS_BETTER)}"
            )
        if item.get("type", "constant") != "constant":
            raise ConfigError(f"{where}, field 'type': got {item['type']!r}; accepted: 'constant'")
        numbers = {}
        for name in ("percentile", "value"):
            v = item.get(name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{where}, field '{name}': got {v!r}; accepted: a finite number")
            numbers[name] = float(v)
        if not 0 <= numbers["percentile"] <= 1:
            raise ConfigError(
                f"{where}, field 'percentile': got {numbers['percentile']}; accepted: 0 ... 1 "
                "(0.99 for P99)"
            )
        slo = SLO(metric, numbers["percentile"], numbers["value"], str(item.get("name") or ""))
        out.append(slo if slo.name else SLO(slo.metric, slo.percentile, slo.value, slo.key))
    return out


def observed_value(values: np.ndarray | WeightedValues, slo: SLO) -> float:
    """The SLO's percentile of the values (NaN left out); +inf when there are none."""
    q = slo.percentile if slo.lower_is_better else 1.0 - slo.percentile
    if isinstance(values, WeightedValues):  # pooled gaps of a run scored in blocks
        if values.size == 0:
            return math.inf
        return values.min() if q <= 0 else values.max() if q >= 1 else values.quantile(q)
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return math.inf
    if q <= 0:
        return float(v.min())
    if q >= 1:
        return float(v.max())
    return float(np.quantile(v, q))


def is_met(observed: float, slo: SLO) -> bool:
    if math.isinf(observed):
        return False
    if math.isclose(observed, slo.value, rel_tol=1e-9):
        return True
    return observed < slo.value if slo.lower_is_better else observed > slo.value


def evaluate_slos(
    slos: Sequence[SLO], values: Mapping[str, np.ndarray | WeightedValues]
) -> dict[str, Any]:
    """Veeksha's `slo_results.json` object for request-level `values` keyed by metric."""
    results = []
    for slo in slos:
        observed = observed_value(values.get(slo.metric, np.empty(0)), slo)
        results.append(
            {
                "met": is_met(observed, slo),
                "slo_metric_key": slo.key,
                "observed_value": observed,
                "threshold": slo.value,
                "percentile": slo.percentile,
                "metric": slo.metric,
                "name": slo.name,
                "lower_is_better": slo.lower_is_better,
            }
        )
    return {"all_slos_met": all(r["met"] for r in results), "results": results}
