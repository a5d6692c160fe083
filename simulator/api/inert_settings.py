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
    return off


def override_key(override: str) -> str:
    """The key a command-line override sets (`+a.b=1`, `~a.b` and `a.b=1` all set `a.b`)."""
    return override.lstrip("+~").split("=", 1)[0]


def inert_overrides(
    cfg: Mapping[str, Any], overrides: Iterable[str], also: Mapping[str, str] | None = None
) -> list[str]:
    """A note for each command-line override of a key `inactive_blocks` leaves unread, or
    one of `also` (a command's own: prefix -> why); the switches themselves, `...enabled=`,
    are never inert."""
    off = {**inactive_blocks(cfg), **(also or {})}
    notes = []
    for override in overrides:
        key = override_key(override)
        if key.endswith(".enabled"):
            continue
        for prefix, why in off.items():
            if key == prefix or key.startswith(prefix):
                notes.append(f"{key} has no effect: {why}")
                break
    return notes
