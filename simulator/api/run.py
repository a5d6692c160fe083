"""Building a run from configuration objects and executing it: the Python API behind `fairsim`."""

from __future__ import annotations

import dataclasses
import logging
import resource
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import MissingConfigException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import policies
from cost_models.base import StepCostModel
from simulator.api.overload import overload_warning
from simulator.api.prefill_profile import profile_prefill
from simulator.core.errors import ConfigError
from simulator.core.seam import CounterPolicy, Policy
from simulator.core.timeline import SpillPlan, Timeline
from simulator.engines import ClusterConfig, Progress, simulate
from simulator.engines.gateway import GatewayConfig
from simulator.engines.step_model import EngineConfig
from simulator.metrics.fairness import fairness_summary, tick_span
from simulator.metrics.latency import inter_token_gaps
from simulator.metrics.prefill_curve import fit_prefill_curve
from simulator.metrics.qoe import QoEConfig, qoe_summary, request_fluidity, request_values
from simulator.metrics.slo import SLO, evaluate_slos, parse_slos
from simulator.report.background import Worker
from simulator.report.blockwise import QoESetup, write_run_in_blocks
from simulator.report.html import write_report
from simulator.report.pictures import draw_run_pictures, run_pictures, run_title
from simulator.report.run_folder import (
    RunOutputs,
    RunTables,
    json_safe,
    mark_completed,
    run_tables,
    write_parquet,
    write_run,
    write_summary,
)
from simulator.report.veeksha import (
    prefilled_tokens,
    prepare_plots,
    request_level_columns,
    write_miss_curve,
    write_rows_and_distributions,
    write_veeksha_summaries,
)
from traces.schema import Trace
from traces.transforms import ClientTimeout


def unfit(trace: Trace, engine: EngineConfig, cost: StepCostModel) -> dict[str, int]:
    """How many requests the engine will refuse on arrival, by reason, to report before a run."""
    reasons = Counter(r for r in engine.refusals(trace, cost).tolist() if r is not None)
    return dict(sorted(reasons.items()))


def build_trace(cfg: DictConfig) -> Trace:
    """The workload's trace, each request labelled with its SLO class where the gateway block
    names classes (or the workload gave them, or the gateway acts), and with `client_timeout`
    (when set) as every request's."""
    workload = instantiate(cfg.workload, _convert_="all")
    trace = with_client_timeout(workload.build(int(cfg.seed)), cfg)
    gateway = gateway_config(cfg)
    if gateway is None or not gateway.labels(trace):
        return trace
    return dataclasses.replace(trace, slo_class=gateway.class_codes(trace))


def with_client_timeout(trace: Trace, cfg: DictConfig) -> Trace:
    """`trace` with `client_timeout` (when set) as every request's."""
    timeout = cfg.get("client_timeout")
    if timeout is None:
        return trace
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(
            f"client_timeout={timeout!r}: expected seconds > 0 (.inf: never) or null (the "
            "workload's own)"
        )
    return ClientTimeout(float(timeout)).apply(trace)


# the fairness policies flow control may run across a band's tenants (gateway.flow_control)
FLOW_FAIRNESS: dict[str, Callable[..., Policy]] = {
    "fcfs": policies.FCFS,
    "round_robin": policies.RoundRobin,
    "wfq": policies.WFQ,
    "vtc": policies.VTC,
    "drr": policies.DRR,
}


def gateway_config(cfg: DictConfig) -> GatewayConfig | None:
    """The `gateway:` block as a GatewayConfig (None without one), with the fairness policy
    its flow control names built."""
    block = cfg.get("gateway")
    if block is None:
        return None
    data = OmegaConf.to_container(block, resolve=True)
    assert isinstance(data, dict)
    fields = dataclasses.fields(GatewayConfig)
    accepted = sorted(f.name for f in fields if f.name != "fairness_policy")
    unknown = sorted(set(data) - set(accepted))
    if unknown:
        raise ConfigError(f"gateway: unknown key(s) {unknown}; accepted: {accepted}")
    flow = data.get("flow_control") or {}
    policy = None
    if isinstance(flow, dict) and flow.get("enabled"):
        name, args = flow.get("fairness", "round_robin"), flow.get("fairness_args") or {}
        if name in FLOW_FAIRNESS:  # an unknown name gets GatewayConfig's error
            try:
                policy = FLOW_FAIRNESS[name](**args)
            except TypeError as err:
                raise ConfigError(
                    f"gateway.flow_control.fairness_args: {err} (settings of policy={name})"
                ) from None
    return GatewayConfig(**{str(k): v for k, v in data.items()}, fairness_policy=policy)


def compose_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """The config `fairsim` would run for these command-line overrides (also from inside a
    running `fairsim`, where Hydra is already initialised)."""
    if GlobalHydra.instance().is_initialized():
        return compose(config_name, overrides=list(overrides))
    with initialize_config_module("conf", version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


def instantiate_parts(
    cfg: DictConfig,
) -> tuple[Policy, StepCostModel, EngineConfig, ClusterConfig | None]:
    """The policy, cost model, engine and cluster a composed config names."""
    cluster = instantiate(cfg.cluster, _convert_="all") if cfg.get("cluster") else None
    if cluster is not None and cluster.processes == "auto" and in_multirun():
        cluster = dataclasses.replace(cluster, processes=1)  # the sweep's jobs use the CPUs
    gateway = gateway_config(cfg)
    if gateway is not None and gateway.active:
        cluster = dataclasses.replace(cluster or ClusterConfig(), gateway=gateway)
    return (
        instantiate(cfg.policy, _convert_="all"),
        instantiate(cfg.cost_model, _convert_="all"),
        instantiate(cfg.engine, _convert_="all"),
        cluster,
    )


def in_multirun() -> bool:
    """This process runs a job of a Hydra multirun sweep."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def simulate_config(cfg: DictConfig, trace: Trace | None = None) -> Timeline:
    """Run a composed config (its workload's trace unless `trace` is given) on its policy,
    cost model, engine and cluster."""
    policy, cost, engine, cluster = instantiate_parts(cfg)
    return simulate(build_trace(cfg) if trace is None else trace, policy, cost, engine, cluster)


class PhaseTimer:
    """Wall time of each phase of a run and the process's peak memory after it, logged at DEBUG
    level on the `fairsim.timing` logger (`fairsim hydra.verbose=fairsim.timing` prints it;
    benchmarks/cli_end_to_end.py reads it)."""

    def __init__(self) -> None:
        self.log = logging.getLogger("fairsim.timing")
        self.log.debug("phase start at %.6f", time.time())

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        self.log.debug("phase %s %.6f peak %.1f MB", phase, time.perf_counter() - start, peak_mb)


def run_config(
    cfg: DictConfig, out_dir: str | Path, progress: Progress | None = None
) -> tuple[Timeline, RunOutputs]:
    """Instantiate everything named in a composed config, run it, write the run folder."""
    phase = PhaseTimer()
    with phase("load"):
        trace = build_trace(cfg)
        policy, cost, engine, cluster = instantiate_parts(cfg)
        slos = config_slos(cfg)
        unfit_counts = unfit(trace, engine, cost)
        named = what_ran(cfg)
        title = run_title(named)
    if unfit_counts:
        counts = ", ".join(f"{n} {reason}" for reason, n in unfit_counts.items())
        print(
            f"fairsim: {sum(unfit_counts.values())} of {len(trace)} requests can never be "
            f"served as configured and will be refused on arrival ({counts})",
            file=sys.stderr,
        )
    with phase("overload check"):
        warning = overload_warning(trace, cost, engine, cluster.replicas if cluster else 1)
    if warning:
        print(warning, file=sys.stderr)
    budget = token_budget(cfg)
    drawing = bool(cfg.get("pictures", True))
    spill = None
    if int(trace.output_len.sum()) > budget:  # may emit more tokens than one table holds
        # steps and counter events are written a sixteenth of the budget at a time: the
        # buffer and the columns made to write it stay small beside the simulation's state
        spill = SpillPlan(Path(out_dir, ".spill"), max(1, budget // 16))
    # the Veeksha plots' child starts now: it imports matplotlib while this process simulates
    drawn = bool(cfg.get("qoe")) and bool(cfg.get("veeksha_metrics", True))
    with Worker(prepare_plots) if drawn else nullcontext() as plots:
        comparison = None
        other = cfg.get("compare_with")
        if other and other != policy.name:  # first: its memory is gone before the run's is taken
            with phase("comparison"):
                again = None if spill is None else SpillPlan(spill.folder / "compare", spill.steps)
                comparison = compare_with_policy(trace, other, cost, engine, cluster, again)
        with phase("simulate"):
            timeline = simulate(trace, policy, cost, engine, cluster, progress, spill)
        resolved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
        setup = qoe_setup(cfg, cost, engine, slos) if cfg.get("qoe") else None
        if spill is not None:
            with phase("write"):
                outputs = write_run_in_blocks(timeline, out_dir, resolved, budget, setup, plots)
                if drawing:  # the steps are read from their file a row group at a time
                    steps = Path(out_dir, "steps.parquet")
                    pictures = run_pictures(outputs.requests, steps, outputs.summary, title)
                    draw_run_pictures(Path(out_dir), pictures)
                if plots is not None:
                    plots.results()
        else:
            with phase("tables"):
                tables = run_tables(timeline)
            qoe = None
            if setup is not None:
                with phase("metrics"):
                    qoe = score_qoe(setup, tables, out_dir, plots)
            with phase("write"):
                outputs = write_run_with_qoe(
                    timeline, out_dir, resolved, tables, qoe, title, plots, drawing
                )
    outputs.summary["unfit_requests"] = unfit_counts
    if comparison is not None:
        outputs.summary["comparison"] = comparison
    outputs.summary["what_ran"] = named
    if spill is not None:
        shutil.rmtree(spill.folder, ignore_errors=True)
    finish_run(outputs, out_dir)
    return timeline, outputs


RUN_PARTS = ("policy", "workload", "engine", "cost_model")


def what_ran(cfg: DictConfig) -> dict[str, Any]:
    """The config chosen for each part of the run (as Hydra chose them; outside a Hydra app,
    the class each part names), the replicas when there are several, and the seed."""
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    named: dict[str, Any] = {}
    for part in RUN_PARTS:
        block = cfg.get(part)
        target = str(block.get("_target_", "")) if isinstance(block, DictConfig) else ""
        name = choices.get(part) or target.rsplit(".", 1)[-1]
        if name:
            named[part] = name
    cluster = cfg.get("cluster")
    scaler = cluster.get("autoscaler") if cluster is not None else None
    if scaler is not None and scaler.get("enabled"):
        named["replicas"] = (
            f"{scaler.min_replicas}-{scaler.max_replicas} autoscaled on {scaler.metric} "
            f"({cluster.dispatcher})"
        )
    elif cluster is not None and int(cluster.get("replicas", 1)) > 1:
        named["replicas"] = f"{cluster.replicas} ({cluster.dispatcher})"
    gateway = cfg.get("gateway")
    if gateway is not None:
        parts = []
        if gateway.admission.type != "always":
            parts.append(f"admission {gateway.admission.type}")
        if gateway.flow_control.enabled:
            parts.append(f"flow control {gateway.flow_control.fairness}")
        if parts:
            named["gateway"] = ", ".join(parts)
    if cfg.get("seed") is not None:
        named["seed"] = cfg.seed
    return named


def finish_run(outputs: RunOutputs, out_dir: str | Path) -> None:
    """The run folder's last files: summary.json, and report.html of it and the folder's
    pictures; then the completion mark, last, when the folder is whole."""
    folder = Path(out_dir)
    write_summary(outputs.summary, folder)
    write_report(folder, outputs.summary)
    mark_completed(folder, outputs.summary["config_digest"])


BYTES_PER_TOKEN = 64  # what a token costs through the in-memory metrics (measured: 55 to 65)


def token_budget(cfg: DictConfig) -> int:
    """Tokens a run may hold in one table under `memory_budget_mb`; a run that may emit more
    writes its records to disk as it goes and is scored in blocks of that many tokens."""
    budget = cfg.get("memory_budget_mb", 512)
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not budget > 0:
        raise ConfigError(f"memory_budget_mb must be a number of megabytes > 0, got {budget!r}")
    return max(1, int(budget * 2**20 / BYTES_PER_TOKEN))


def config_slos(cfg: DictConfig) -> list[SLO]:
    """The config's `slos:` list, each entry checked."""
    raw = cfg.get("slos")
    return parse_slos(OmegaConf.to_container(raw) if raw else [])  # type: ignore[arg-type]


def write_scored_run(
    timeline: Timeline,
    out_dir: str | Path,
    cfg: DictConfig,
    engine_parts: Callable[[], tuple[StepCostModel, EngineConfig]],
    check_rate: bool = True,
    set_aside: np.ndarray | None = None,
) -> RunOutputs:
    """The run folder of a timeline made outside `run_config` (a live session, a measured
    run), scored as `run_config` scores one: QoE, SLOs and the Veeksha files, if the config
    asks. `engine_parts` gives the cost model and engine the QoE deadlines are read from (only
    called then); `check_rate=False` skips Veeksha's check of the arrivals against the
    workload's rate (clients chose them). `set_aside` (a mask over the request rows) takes
    requests out of the scored tables into warmup_requests.parquet and warmup_tokens.parquet.
    Left marked running, for the caller to add to its summary and `finish_run`."""
    resolved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    setup = None
    if cfg.get("qoe") and len(timeline.arrival):
        setup = qoe_setup(cfg, *engine_parts(), config_slos(cfg))
        if not check_rate:
            setup = dataclasses.replace(setup, configured_rate=None)
    with Worker(prepare_plots) if setup and setup.veeksha else nullcontext() as plots:
        tables = run_tables(timeline)
        if set_aside is not None:
            tables = write_set_aside(tables, set_aside, Path(out_dir))
        qoe = score_qoe(setup, tables, out_dir, plots) if setup else None
        named = what_ran(cfg)
        outputs = write_run_with_qoe(
            timeline, out_dir, resolved, tables, qoe, run_title(named), plots,
            bool(cfg.get("pictures", True)),
        )  # fmt: skip
    outputs.summary["what_ran"] = named
    return outputs


def write_set_aside(tables: RunTables, rows: np.ndarray, folder: Path) -> RunTables:
    """Write the requests of `rows` (a mask over the request rows) and their tokens to
    warmup_requests.parquet and warmup_tokens.parquet; return the tables without them."""
    requests, tokens, steps = tables
    aside = requests.request_id.to_numpy()[rows]
    theirs = tokens.request_id.isin(aside).to_numpy()
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet(requests[rows], folder / "warmup_requests.parquet")
    write_parquet(tokens[theirs], folder / "warmup_tokens.parquet")
    kept = requests[~rows].reset_index(drop=True)
    return kept, tokens[~theirs].reset_index(drop=True), steps


def qoe_setup(
    cfg: DictConfig, cost: StepCostModel, engine: EngineConfig, slos: list[SLO]
) -> QoESetup:
    """The `qoe:` block, the prefill curve when its TTFT deadline comes from one, the SLOs and
    the workload's rate (Veeksha's health check)."""
    qoe_cfg: QoEConfig = instantiate(cfg.qoe, _convert_="all")
    curve = None
    if qoe_cfg.ttft_deadline is None:
        curve = fit_prefill_curve(profile_prefill(cost, engine))
    workload = instantiate(cfg.workload, _convert_="all")
    rate = workload.configured_rate() if hasattr(workload, "configured_rate") else None
    veeksha = bool(cfg.get("veeksha_metrics", True))
    return QoESetup(qoe_cfg, curve, slos, rate, veeksha, run_title(what_ran(cfg)))


@dataclass
class QoEScores:
    """What scoring a run's QoE made: the summary's `qoe` block and what the SLOs and the
    Veeksha files are computed from."""

    setup: QoESetup
    summary: dict[str, Any]  # the summary's `qoe` block
    values: dict[str, np.ndarray]  # request_values' per-request metrics
    rows: dict[str, np.ndarray] | None  # request_level_columns (None: no Veeksha files)


def score_qoe(
    setup: QoESetup, tables: RunTables, out_dir: str | Path, plots: Worker | None
) -> QoEScores:
    """The QoE of the run's tables. With Veeksha files asked for, `plots` (a `Worker` of
    `prepare_plots`) writes those made of every decode gap meanwhile: the miss curve as soon as
    the gaps exist, then the rows and the distributions (`write_run_with_qoe` waits for them)."""
    r, t, _ = tables
    cfg, curve = setup.config, setup.curve
    facts, gaps = inter_token_gaps(r, t)
    decode_gaps = gaps.drop_first()
    folder = Path(out_dir, "metrics")
    if setup.veeksha:
        if plots is None:
            raise ValueError("score_qoe: the Veeksha files are written by a Worker (plots)")
        folder.mkdir(parents=True, exist_ok=True)
        plots.submit(write_miss_curve, folder, decode_gaps, cfg.exact)
    flu = request_fluidity(r, t, cfg, curve)
    values = request_values(r, t, cfg, curve, flu)
    values["tbc"] = decode_gaps.values  # the same gaps in the same order: one array, not two
    rows = None
    if setup.veeksha:
        assert plots is not None
        rows = request_level_columns(r, t, cfg, curve, flu)
        clients = facts["client"].astype(str).to_numpy()
        labels = {"request": clients, "tbc": np.repeat(clients, decode_gaps.lengths)}
        plots.submit(
            write_rows_and_distributions, folder, rows, decode_gaps, values, labels, setup.title
        )
    block = json_safe(qoe_summary(r, t, cfg, curve, flu, decode_gaps))
    return QoEScores(setup, block, values, rows)


def write_run_with_qoe(
    timeline: Timeline,
    out_dir: str | Path,
    resolved: dict[str, Any],
    tables: RunTables,
    qoe: QoEScores | None,
    title: str,
    plots: Worker | None = None,
    pictures: bool = True,
) -> RunOutputs:
    """`write_run` (leaving the folder marked running), `add_qoe` and, with `pictures`, the
    pictures of the run over time (`title` names the run on them); then waits for the files
    `plots` writes (`score_qoe`), drawn meanwhile."""
    outputs = write_run(timeline, out_dir, resolved, complete=False, tables=tables)
    if qoe is not None:
        add_qoe(outputs, out_dir, qoe)
    assert outputs.steps is not None
    if pictures:
        drawn = run_pictures(outputs.requests, outputs.steps, outputs.summary, title, tables[1])
        draw_run_pictures(Path(out_dir), drawn)
    if plots is not None:
        plots.results()
    return outputs


def add_qoe(outputs: RunOutputs, out_dir: str | Path, qoe: QoEScores) -> None:
    """The `qoe` block and the SLO results of the summary (the caller writes summary.json),
    and (unless switched off) the Veeksha-compatible files under metrics/ other than those
    `score_qoe` has written meanwhile."""
    outputs.summary["qoe"] = qoe.summary
    setup = qoe.setup
    if not setup.veeksha:
        results = evaluate_slos(setup.slos, qoe.values)
        outputs.summary["slo_results"] = json_safe(results)
        return
    assert outputs.steps is not None and qoe.rows is not None
    results = write_veeksha_summaries(
        Path(out_dir, "metrics"),
        outputs.requests,
        len(qoe.rows["request_id"]),
        qoe.values,
        qoe.summary["fluid_token_rate"],
        qoe.rows["num_delta_prompt_tokens"],
        qoe.rows["ttfc"],
        prefilled_tokens(outputs.steps),
        setup.slos,
        setup.configured_rate,
    )
    outputs.summary["slo_results"] = json_safe(results)


def compare_with_policy(
    trace: Trace,
    policy_name: str,
    cost: StepCostModel,
    engine: EngineConfig,
    cluster: ClusterConfig | None = None,
    spill: SpillPlan | None = None,
) -> dict[str, Any]:
    """The same trace and engine under another policy (its conf/policy default): its fairness
    figures and throughput, for the side-by-side printout. Under `global_vtc` a policy without
    per-client counters shares one queue across the replicas instead (`central`). `spill`:
    where a large run's step records go (they are not kept)."""
    try:
        composed = compose_config([f"policy={policy_name}"])
    except MissingConfigException as err:
        accepted = ", ".join(sorted(err.options or []))
        raise ConfigError(
            f"compare_with={policy_name}: no such policy; accepted: {accepted}, or null"
        ) from None
    policy = instantiate(composed.policy, _convert_="all")
    if cluster is not None and cluster.dispatcher == "global_vtc":
        shares = isinstance(policy, CounterPolicy)
        cluster = cluster if shares else dataclasses.replace(cluster, dispatcher="central")
    timeline = simulate(trace, policy, cost, engine, cluster, spill=spill)
    requests, tokens = timeline.requests_frame(), timeline.last_tokens()
    total = tick_span(timeline.info.get("end_time"))
    dispatcher = {"dispatcher": cluster.dispatcher} if cluster is not None else {}
    return {"policy": policy_name, **dispatcher, **fairness_summary(requests, tokens, total=total)}
