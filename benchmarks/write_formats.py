"""The two file formats a large run's write phase chose, against the defaults they replaced,
timed side by side in one process on synthetic data shaped like a run's:

- spill files (`simulator.core.counters.SPILL_FORMAT`: no dictionaries, no compression) against
  Parquet's defaults, on `--rows` step records of five columns, written and read back once;
- Veeksha's request rows (`simulator.report.veeksha.ROWS_COMPRESSION`) against gzip level 6, on
  JSON lines of decode gaps: `--requests` requests of 180 gaps each, the gaps of a few distinct
  step times (a busy engine's) or all distinct (`--distinct`), or the first `--max-bytes` of a
  run's own rows (`--rows-file`: its metrics/request_level_metrics.jsonl.gz).

Prints each one's seconds (best of `--repeat`) and bytes, and one JSON object last.

Usage: python benchmarks/write_formats.py [--rows 4000000] [--requests 20000] [--distinct]
       [--rows-file PATH [--max-bytes 60000000]]
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.core.counters import SPILL_FORMAT
from simulator.report.veeksha import ROWS_COMPRESSION


def best(seconds: Callable[[], float], repeat: int) -> float:
    return min(seconds() for _ in range(repeat))


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def spill_formats(rows: int, repeat: int, folder: Path) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "start": np.cumsum(rng.random(rows)),
            "kv_used": rng.integers(0, 10**6, rows),
            "kind": rng.integers(0, 3, rows).astype(np.int8),
            "batch_size": rng.integers(1, 256, rows).astype(np.int32),
            "num_tokens": rng.integers(1, 2048, rows).astype(np.int32),
        }
    )
    out = {}
    for name, options in (("parquet defaults", {}), ("SPILL_FORMAT", SPILL_FORMAT)):
        path = folder / f"{name}.parquet"
        write = best(lambda p=path, o=options: timed(lambda: pq.write_table(table, p, **o)), repeat)
        read = best(lambda p=path: timed(lambda: pq.read_table(p)), repeat)
        out[name] = {"write_s": write, "read_s": read, "bytes": path.stat().st_size}
    return out


def synthetic_rows(requests: int, distinct: bool) -> bytes:
    rng = np.random.default_rng(1)
    steps = rng.uniform(0.02, 0.05, 4096 if distinct else 40)  # distinct step times
    return b"".join(
        orjson.dumps(
            {"request_id": i, "tbc": steps[rng.integers(0, steps.shape[0], 180)].tolist()},
            option=orjson.OPT_APPEND_NEWLINE,
        )
        for i in range(requests)
    )


def row_compression(lines: bytes, repeat: int) -> dict[str, dict[str, float]]:
    out = {"json": {"seconds": 0.0, "bytes": len(lines)}}
    for level in sorted({6, ROWS_COMPRESSION}):
        packed = zlib.compress(lines, level)
        out[f"gzip level {level}"] = {
            "seconds": best(lambda v=level: timed(lambda: zlib.compress(lines, v)), repeat),
            "bytes": len(packed),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--distinct", action="store_true", help="every gap value distinct")
    parser.add_argument("--rows-file", help="a run's request_level_metrics.jsonl.gz instead")
    parser.add_argument("--max-bytes", type=int, default=60_000_000, help="of --rows-file")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spill = spill_formats(args.rows, args.repeat, Path(tmp))
    for name, r in spill.items():
        print(f"{name:18s} write {r['write_s']:.3f} s, read {r['read_s']:.3f} s, "
              f"{r['bytes'] / 1e6:.1f} MB")  # fmt: skip
    base, new = spill["parquet defaults"], spill["SPILL_FORMAT"]
    print(f"spill files: written {base['write_s'] / new['write_s']:.1f}x and read "
          f"{base['read_s'] / new['read_s']:.1f}x faster")  # fmt: skip
    if args.rows_file:
        lines = gzip.decompress(Path(args.rows_file).read_bytes())[: args.max_bytes]
    else:
        lines = synthetic_rows(args.requests, args.distinct)
    rows = row_compression(lines, args.repeat)
    for name, r in rows.items():
        print(f"{name:18s} {r['seconds']:.3f} s, {r['bytes'] / 1e6:.2f} MB")
    print(json.dumps({"spill": spill, "request_rows": rows}))


if __name__ == "__main__":
    main()
