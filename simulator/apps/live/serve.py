"""`fairsim-serve`: an OpenAI-compatible endpoint whose timing is the simulation (live mode).

Configured like `fairsim` (engine, cost_model, policy, cluster groups) plus the `serve:` block
(`ServeConfig`). It binds loopback only, prints the address it listens on, and on SIGINT or
SIGTERM stops accepting, lets in-flight streams finish for `serve.grace` seconds, and writes the
usual run folder (requests, tokens, steps, counters, summary) plus `socket_writes.parquet`: per
streamed token, its simulated time and when it was written to the socket (on the simulated
clock), so the lag is measurable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from aiohttp import web
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from prometheus_client import CollectorRegistry

from simulator.api.config_check import build_block
from simulator.api.run import finish_run, instantiate_parts, write_scored_run
from simulator.apps.common import hydra_jobs
from simulator.apps.common.event_loop import run_loop
from simulator.apps.common.tokenizer import load_tokenizer
from simulator.apps.live.metrics import ServerMetrics
from simulator.apps.live.server import (
    LiveEngine,
    ServerSettings,
    Stream,
    estimate_tokens,
    make_app,
)
from simulator.core.errors import ConfigError
from simulator.core.timeline import Timeline
from simulator.engines.live import LiveSession
from simulator.report.run_folder import write_parquet

LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass
class ServeConfig:
    """The `serve:` block."""

    host: str = "127.0.0.1"  # loopback only: 127.0.0.1, ::1 or localhost
    port: int = 8000  # 0: any free port (printed)
    time_scale: float = 1.0  # simulated seconds per wall second (> 1: faster, for tests)
    max_waiting: int = 1000  # waiting requests beyond this answer 429 with Retry-After
    model: str = "fairsim"  # the model name /v1/models lists
    clients: dict[str, float] | None = None  # known clients and their weights
    api_keys: dict[str, str] | None = None  # API key -> client (then unknown keys get 401)
    apps: dict[str, list[str]] | None = None  # app -> its clients (FairServe); others: default
    max_clients: int = 64  # distinct clients a session can hold (known ones included)
    capacity: int = 100_000  # requests a session can hold
    grace: float = 5.0  # seconds in-flight streams get to finish at shutdown
    chars_per_token: float = 4.0  # prompt-length estimate for text (no tokenizer)
    tokenizer: str | None = None  # "module:function": text -> token count (or token ids)
    default_max_tokens: int = 256  # chat requests without max_tokens
    # clients' warm-up and connection tests: the first `warmup_requests` requests, and those
    # arriving within `warmup_seconds` of the first, are marked `warmup` in requests.parquet;
    # `exclude_warmup` moves them to warmup_requests.parquet, out of the summary and metrics
    warmup_requests: int = 0
    warmup_seconds: float = 0.0
    exclude_warmup: bool = False

    def __post_init__(self) -> None:
        self.clients, self.api_keys = dict(self.clients or {}), dict(self.api_keys or {})
        members = [c for group in (self.apps or {}).values() for c in group]
        if len(members) != len(set(members)):
            raise ConfigError(f"serve.apps={self.apps!r}: a client belongs to one app at most")
        if self.host not in LOOPBACK:
            raise ConfigError(f"serve.host={self.host!r}: accepted: {', '.join(LOOPBACK)}")
        checks = (
            ("port", 0 <= self.port <= 65535, "an integer in 0..65535"),
            ("time_scale", self.time_scale > 0, "a number > 0"),
            ("max_waiting", self.max_waiting >= 1, "an integer >= 1"),
            (
                "max_clients",
                self.max_clients >= len({*self.clients, *members, "default"}),
                "at least the known clients (serve.clients, serve.apps, default)",
            ),
            ("capacity", self.capacity >= 1, "an integer >= 1"),
            ("grace", self.grace >= 0, "a number >= 0"),
            ("chars_per_token", self.chars_per_token > 0, "a number > 0"),
            ("default_max_tokens", self.default_max_tokens >= 1, "an integer >= 1"),
            ("warmup_requests", self.warmup_requests >= 0, "an integer >= 0"),
            ("warmup_seconds", self.warmup_seconds >= 0, "a number of seconds >= 0"),
        )
        for name, ok, accepted in checks:
            if not ok:
                raise ConfigError(f"serve.{name}={getattr(self, name)!r}: expected {accepted}")
        for name, w in self.clients.items():
            if not w > 0:
                raise ConfigError(f"serve.clients[{name}]={w!r}: expected a weight > 0")


def tokenizer(serve: ServeConfig) -> Callable[[str], int]:
    """`serve.tokenizer` if set, else the tokenizer-free estimate."""
    if serve.tokenizer is None:
        return estimate_tokens(serve.chars_per_token)
    return load_tokenizer(serve.tokenizer, "serve.tokenizer")


def build(cfg: DictConfig) -> tuple[ServeConfig, LiveEngine, LiveSession]:
    serve = build_block(cfg, "serve", ServeConfig)
    policy, cost, engine, cluster = instantiate_parts(cfg)
    known = dict(serve.clients or {})
    app_of = {c: app for app, members in (serve.apps or {}).items() for c in members}
    for name in [*app_of, "default"]:  # an app's members hold slots from the start
        known.setdefault(name, 1.0)
    names = [*known, *(f"<slot {k}>" for k in range(serve.max_clients - len(known)))]
    weights = [*known.values(), *([1.0] * (len(names) - len(known)))]
    apps = tuple(app_of.get(n, "default") for n in names) if serve.apps else None
    session = LiveSession(
        policy, cost, engine, cluster, tuple(names), tuple(weights), serve.capacity, apps
    )
    clients = {name: i for i, name in enumerate(known)}
    live = LiveEngine(session, serve.time_scale, clients, list(range(len(known), len(names))))
    return serve, live, session


async def serve_until_signal(cfg: DictConfig, out_dir: str) -> None:
    serve, live, session = build(cfg)
    registry = CollectorRegistry()
    settings = ServerSettings(
        serve.model,
        serve.max_waiting,
        serve.api_keys or {},
        tokenizer(serve),
        serve.default_max_tokens,
    )
    app = make_app(live, settings, registry, ServerMetrics(registry, serve.model, session))
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=serve.grace, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, serve.host, serve.port)
    try:
        await site.start()
    except OSError as err:  # the port is taken (or not ours to bind): the user's setting
        await runner.cleanup()
        raise ConfigError(
            f"serve.port={serve.port}: cannot listen on {serve.host}:{serve.port} "
            f"({err.strerror or err}); choose another port, or serve.port=0 for any free one"
        ) from None
    port = runner.addresses[0][1]
    print(
        f"fairsim-serve: listening on http://{serve.host}:{port}/v1 "
        f"(policy {session.runner.policies[0].name}, time scale {serve.time_scale:g})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # what start-up made (modules, the config, the engine) lives as long as the server: out of
    # the collector's way, collections pause the token streams for less (benchmarks/
    # serve_load.py, three runs each: GC pauses 28.8 -> 26.0 ms in all, lag p50 2.9 -> 2.6 ms)
    gc.freeze()
    driver = asyncio.create_task(live.drive())
    await stop.wait()
    print("fairsim-serve: stopping (in-flight streams get serve.grace seconds)", flush=True)
    await site.stop()  # no new connections
    await runner.cleanup()  # waits for in-flight handlers up to the grace
    live.stopped = True
    live.wake.set()
    await driver
    write_folder(out_dir, cfg, serve, session, live)


def write_folder(
    out_dir: str, cfg: DictConfig, serve: ServeConfig, session: LiveSession, live: LiveEngine
) -> None:
    """The run folder of a live session, and the socket write time of every streamed token."""
    timeline = rename_clients(session.close(), live.clients)
    ids = np.full(len(timeline.arrival), None, dtype=object)
    for s in live.finished:
        ids[s.row] = s.client_request_id
    timeline.request_columns["client_request_id"] = ids  # X-Request-Id: joins a client's records
    warmup = warmup_rows(np.asarray(timeline.arrival), serve.warmup_requests, serve.warmup_seconds)
    timeline.request_columns["warmup"] = warmup
    outputs = write_scored_run(
        timeline,
        out_dir,
        cfg,
        lambda: (session.cost, session.engine),
        check_rate=False,
        set_aside=warmup if serve.exclude_warmup else None,
    )
    # simulated time t happened at monotonic clock time started_monotonic + t / time_scale
    outputs.summary["clock"] = {
        "started_monotonic": live.clock.start,
        "time_scale": live.clock.scale,
        "time_origin": 0.0,
    }
    writes = socket_writes(live.finished)
    write_parquet(writes, Path(out_dir, "socket_writes.parquet"))
    outputs.summary["socket_lag"] = lag_summary(writes, live.clock.scale, live.gc_pauses)
    finish_run(outputs, out_dir)
    done = outputs.summary["status_counts"]
    print(f"fairsim-serve: {len(timeline.arrival)} requests ({done}); run folder {out_dir}")


def warmup_rows(arrival: np.ndarray, first: int, seconds: float) -> np.ndarray:
    """Per request row: is it among the `first` requests to arrive, or did it arrive within
    `seconds` of the first one (a client's warm-up or connection test)?"""
    warmup = np.zeros(arrival.shape[0], dtype=bool)
    sent = np.flatnonzero(~np.isnan(arrival))
    if not sent.size:
        return warmup
    order = sent[np.argsort(arrival[sent], kind="stable")]
    warmup[order[:first]] = True
    if seconds > 0:
        warmup[sent[arrival[sent] < arrival[order[0]] + seconds]] = True
    return warmup


def socket_writes(finished: list[Stream]) -> pd.DataFrame:
    """Every streamed token: its simulated time, when the driver released it to its stream and
    when its stream wrote it to the socket (the simulated clock); the lag and its two parts."""
    rows: list[int] = []
    index: list[int] = []
    sim: list[float] = []
    released: list[float] = []
    written: list[float] = []
    for s in finished:
        n = len(s.written_at)
        rows += [s.row] * n
        index += range(n)
        sim += s.sim_times[:n]
        released += s.released_at
        written += s.written_at
    writes = pd.DataFrame(
        {
            "request_id": np.asarray(rows, dtype=np.int64),
            "index": np.asarray(index, dtype=np.int64),
            "time": np.asarray(sim),
            "released_at": np.asarray(released),
            "written_at": np.asarray(written),
        }
    )
    writes["lag"] = writes["written_at"] - writes["time"]
    writes["release_lag"] = writes["released_at"] - writes["time"]
    writes["write_lag"] = writes["written_at"] - writes["released_at"]
    return writes


def lag_summary(writes: pd.DataFrame, time_scale: float, gc_pauses: list[float]) -> dict[str, Any]:
    """Where the late writes come from, in wall-clock ms: the lag, and its parts: the release
    lag (the driver woke up late, or was busy stepping the simulation) and the write lag (the
    stream's handler ran late: other handlers, the socket); and the garbage collector's pauses
    meanwhile (each one delays both)."""
    out: dict[str, Any] = {"tokens": len(writes)}
    for name in ("lag", "release_lag", "write_lag"):
        ms = writes[name].to_numpy() * 1000 / time_scale
        out[f"{name}_ms"] = (
            {f"p{p}": float(np.percentile(ms, p)) for p in (50, 90, 99)} | {"max": float(ms.max())}
            if ms.size
            else None
        )
    pauses = np.asarray(gc_pauses) * 1000
    out["gc_pauses"] = {
        "count": int(pauses.size),
        "total_ms": float(pauses.sum()),
        "max_ms": float(pauses.max()) if pauses.size else 0.0,
    }
    return out


def rename_clients(timeline: Timeline, clients: dict[str, int]) -> Timeline:
    """The session's client slots under the names the clients used."""
    names = list(timeline.trace.client_names)
    for name, slot in clients.items():
        names[slot] = name
    trace = dataclasses.replace(timeline.trace, client_names=tuple(names))
    counters = timeline.counters
    if counters is not None and "client" in counters:
        slot_names = dict(zip(timeline.trace.client_names, names, strict=True))
        counters = counters.assign(client=counters["client"].map(slot_names))
    return dataclasses.replace(timeline, trace=trace, counters=counters)


# the keys of config.yaml a live session never reads, and why
UNREAD = {
    "workload": "fairsim-serve serves the requests its clients send, not a workload (a workload "
    "drives `fairsim` runs and `fairsim-bench`)",
    "client_timeout": "fairsim-serve's clients give up on their own (their HTTP timeouts); it "
    "drops a request whose client disconnects",
    "seed": "fairsim-serve draws no workload (engine.step_jitter_seed seeds its step-time jitter)",
    **dict.fromkeys(
        ("replications", "replicate_workload", "replication_jobs"),
        "a live session runs once; replications are for `fairsim` runs",
    ),
}


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="serve")
def _main(cfg: DictConfig) -> None:
    out_dir = HydraConfig.get().runtime.output_dir
    hydra_jobs.run_job(
        "fairsim-serve",
        cfg,
        out_dir,
        lambda: run_loop(serve_until_signal(cfg, out_dir)),
        unread=UNREAD,
    )


def main() -> None:
    hydra_jobs.run_hydra_command("fairsim-serve", _main)


if __name__ == "__main__":
    main()
