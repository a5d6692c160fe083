"""Live-mode load benchmark (target on a 2-core x86 VM with 24 GB, load generator included: p99 lag
<= 10 ms at >= 2,000 tokens/s; measured 8.5-9.0 ms at 2,329 tokens/s in three runs). On a
slower VM (2026-11-29, 2,268 tokens/s), once the driver hands out a step's tokens before it
forms the next step, old and new code alternating: p99 lag 18.3 and 19.6 -> 14.6 and 14.0 ms,
its release part's p99 9.0 and 8.4 -> 0.76 ms (`--seconds 15`).

Starts `fairsim-serve` (real time, S-LoRA engine with the default A10G / Llama-7B cost model and
a 100,000-token pool, FCFS) and runs N streaming clients in this process (default 200), each
sending one request after another (40 prompt token ids, 20-80 output tokens, uniform: equal
lengths would make every stream end and restart in the same step) for `--seconds`.
tokens_per_s counts the tokens the clients received; the lag of each token is the time the
server wrote it to its socket minus its simulated time (`socket_writes.parquet`), split into
the release lag (the server's driver handed the token to its stream late: it woke up late or
was stepping the simulation) and the write lag (the stream's handler wrote it late: other
handlers, the socket), with the garbage collector's pauses (summary.json's `socket_lag`).
Prints one JSON object last.

Usage: python benchmarks/serve_load.py [--streams 200] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd

BIN = Path(sys.executable).parent
SERVER = [
    "policy=fcfs",
    "cost_model=roofline",
    "cost_model.gpu=a10g",
    "engine.pool_tokens=100000",
    "serve.max_waiting=100000",
]


async def user(url: str, until: float, counts: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < until:
            body = {"model": "fairsim", "prompt": list(range(40)), "stream": True,
                    "max_tokens": int(rng.integers(20, 81))}  # fmt: skip
            async with http.post(f"{url}/completions", json=body) as response:
                async for line in response.content:
                    if line.startswith(b"data: {"):
                        counts[0] += 1


async def load(url: str, streams: int, seconds: float) -> float:
    counts = [0]
    start = time.monotonic()
    await asyncio.gather(*(user(url, start + seconds, counts, i) for i in range(streams)))
    return counts[0] / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        server = subprocess.Popen(
            [str(BIN / "fairsim-serve"), "serve.port=0", f"hydra.run.dir={folder}", *SERVER],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        port = re.search(r"127\.0\.0\.1:(\d+)", server.stdout.readline())
        assert port, "fairsim-serve did not start"
        rate = asyncio.run(load(f"http://127.0.0.1:{port.group(1)}/v1", args.streams, args.seconds))
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=120)
        writes = pd.read_parquet(Path(folder, "socket_writes.parquet"))
        parts = json.loads(Path(folder, "summary.json").read_text())["socket_lag"]
    lag_ms = 1000 * writes["lag"].to_numpy()
    p50, p99 = np.percentile(lag_ms, [50, 99]) if lag_ms.size else (np.nan, np.nan)
    print(
        f"{args.streams} streams for {args.seconds:g} s: {rate:.0f} tokens/s received, "
        f"lag p50 {p50:.2f} ms, p99 {p99:.2f} ms (target: p99 <= 10 ms at >= 2,000 tokens/s)"
    )
    release, write, pauses = parts["release_lag_ms"], parts["write_lag_ms"], parts["gc_pauses"]
    print(
        f"  of which: release (the driver late or stepping) p50 {release['p50']:.2f} ms, p99 "
        f"{release['p99']:.2f} ms; write (handlers and sockets) p50 {write['p50']:.2f} ms, p99 "
        f"{write['p99']:.2f} ms; {pauses['count']} GC pauses, {pauses['total_ms']:.1f} ms in all, "
        f"the longest {pauses['max_ms']:.2f} ms"
    )
    print(
        json.dumps(
            {
                "streams": args.streams,
                "tokens_per_s": round(rate, 1),
                "lag_p50_ms": round(float(p50), 3),
                "lag_p99_ms": round(float(p99), 3),
                "tokens": int(lag_ms.size),
                "socket_lag": parts,
            }
        )
    )


if __name__ == "__main__":
    main()
