"""Settings given on the command line that the run did not read, because the block they
belong to is off (`gateway.flow_control.fairness=vtc` with flow control disabled): each gets a
one-line note when the run ends, so that no setting is ignored silently. A note, not an error:
a sweep may switch a block on and off with the same settings
(`gateway.flow_control.enabled=true,false`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

TOKEN_BUCKET_KEYS = ("rate", "burst", "tenant_rate", "tenant_burst", "input_cost", "output_cost")


def inactive_blocks(cfg: Mapping[str, Any]) -> dict[str, str]:
    """Key prefixes (a block, or one key) the config leaves unread, each with why."""
    off: dict[str, str] = {}
    if int(cfg.get("replications") or 1) == 1:
        for key in ("replicate_workload", "replication_jobs"):
            off[key] = "replications is 1 (one run)"
    cluster = cfg.get("cluster") or {}
    scaler = cluster.get("autoscaler") or {}
    if not scaler.get("enabled", False):
        off["cluster.autoscaler."] = "cluster.autoscaler.enabled is false"
    pools = int(cluster.get("prefill_replicas") or 0) > 0
    if not pools:
        off["cluster.disaggregation."] = "cluster.prefill_replicas is 0 (no disaggregated pools)"
    pd = cluster.get("disaggregation") or {}
    dispatchers = {cluster.get("dispatcher")}
    if pools:
        dispatchers |= {pd.get("prefill_dispatcher"), pd.get("decode_dispatcher")}
    if "scored" not in dispatchers:
        off["cluster.routing."] = "no dispatcher is `scored` (cluster.dispatcher, or a pool's)"
    gateway = cfg.get("gateway") or {}
    flow = (gateway.get("flow_control") or {}).get("enabled", False)
    if not flow:
        off["gateway.flow_control."] = "gateway.flow_control.enabled is false"
    kind = (gateway.get("admission") or {}).get("type", "always")
    if kind != "token_bucket":
        for key in TOKEN_BUCKET_KEYS:
            off[f"gateway.admission.{key}"] = f"gateway.admission.type is {kind}, not token_bucket"
    if kind != "tier_shedding":
        off["gateway.admission.overload_queue_depth"] = (
            f"gateway.admission.type is {kind}, not tier_shedding"
        )
    if not flow and kind != "saturation":
        off["gateway.saturation."] = (
            "only flow control and gateway.admission.type=saturation read it (both off)"
        )
    off.update(_capacity_mode(cfg))
    return off


# fairsim-capacity's settings each mode reads (the others go unread)
CAPACITY_MODE_KEYS = {
    "max_iterations": ("etalon",),
    "precision": ("veeksha",),
    "lower": ("evalscope", "steady_state"),
    "num_runs": ("evalscope", "steady_state"),
    "sla_params": ("evalscope", "steady_state"),
    "number_multiplier": ("evalscope",),
    "dispatch_gap": ("evalscope",),
    "client_seed": ("evalscope",),
}


def _capacity_mode(cfg: Mapping[str, Any]) -> dict[str, str]:
    """fairsim-capacity: the settings its mode does not read (EvalScope and steady-state
    searches judge `sla_params`, not `slos` and their QoE deadlines)."""
    capacity = cfg.get("capacity")
    if not capacity:
        return {}
    mode = capacity.get("mode")
    off = {
        f"capacity.{key}": f"capacity.mode is {mode} (read by {', '.join(modes)})"
        for key, modes in CAPACITY_MODE_KEYS.items()
        if mode not in modes
    }
    if mode in ("evalscope", "steady_state"):
        why = f"capacity.mode={mode} judges capacity.sla_params"
        off.update({"slos": why, "qoe.": why})
    return off


def inert_overrides(cfg: Mapping[str, Any], overrides: Iterable[str]) -> list[str]:
    """A note for each command-line override of a key `inactive_blocks` leaves unread (the
    switches themselves, `...enabled=`, are never inert)."""
    off = inactive_blocks(cfg)
    notes = []
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key.endswith(".enabled"):
            continue
        for prefix, why in off.items():
            if key == prefix or key.startswith(prefix):
                notes.append(f"{key} has no effect: {why}")
                break
    return notes
