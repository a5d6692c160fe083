"""Readers for real trace files: every format becomes one validated `Trace`.

Formats (workloads.md section 2): the Azure LLM inference 2023 CSVs, Vidur's trace CSV, the VTC
real trace, Mooncake-style JSONL, Etalon's length-only CSVs, and any CSV / Parquet / JSONL table
with a column mapping. Files are read as UTF-8 text or Parquet, never unpickled. Every error is a
`TraceError` naming the file, the row (0-based data row, header excluded) and the field, and
saying what is accepted. Timestamps must increase strictly unless `sort=True` (sort them) or
`duplicates=True` (equal timestamps allowed).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.schema import Trace, TraceError, int_column

TABLE_FORMATS = ("csv", "parquet", "jsonl")
SUFFIX_FORMAT = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl"}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def resolve_path(path: str | Path, what: str = "trace file") -> Path:
    """A relative path is looked up from the working directory, then from the project root, so
    defaults such as ../shared/data/... work from a checkout with `shared` beside it."""
    p = Path(path)
    candidates = [p] if p.is_absolute() else [p, PROJECT_ROOT / p]
    for c in candidates:
        if c.exists():
            return c
    looked = ", ".join(str(c) for c in candidates)
    raise TraceError(f"{path}: {what} not found (looked in {looked})")


def read_table(path: str | Path, fmt: str | None = None) -> pd.DataFrame:
    """Read a CSV (UTF-8, header row), Parquet or JSONL (one JSON object per line) file."""
    p = resolve_path(path)
    if not p.is_file():
        raise TraceError(f"{p}: not a file; accepted: a {'/'.join(TABLE_FORMATS)} file")
    fmt = fmt or SUFFIX_FORMAT.get(p.suffix.lower())
    if fmt not in TABLE_FORMATS:
        raise TraceError(
            f"{p}: format {fmt or p.suffix!r} unknown; accepted: {TABLE_FORMATS} "
            f"(from the suffix {tuple(SUFFIX_FORMAT)} or given explicitly)"
        )
    if fmt == "parquet":
        try:
            frame = pd.read_parquet(p)
        except Exception as err:  # pyarrow raises several types for corrupt files
            raise TraceError(
                f"{p}: not a readable Parquet file ({err}); accepted: Parquet"
            ) from None
    else:
        text = _utf8(p)
        frame = _read_csv(p, text) if fmt == "csv" else _read_jsonl(p, text)
    if len(frame) == 0:
        raise TraceError(f"{p}: the file has no data rows; accepted: at least one row")
    return frame


def _utf8(p: Path) -> str:
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n")
        raise TraceError(
            f"{p}: line {line + 1} is not UTF-8 (byte {err.start}); accepted: UTF-8 text"
        ) from None


def _read_csv(p: Path, text: str) -> pd.DataFrame:
    if not text.strip():
        raise TraceError(f"{p}: the file is empty; accepted: a header row and data rows")
    try:
        return pd.read_csv(io.StringIO(text))
    except pd.errors.ParserError as err:
        raise TraceError(f"{p}: malformed CSV ({err}); accepted: comma-separated rows") from None


def _read_jsonl(p: Path, text: str) -> pd.DataFrame:
    rows = []
    for line_no, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise TraceError(
                f"{p}: line {line_no + 1} is not JSON ({err.msg}); accepted: one JSON object "
                "per line"
            ) from None
        if not isinstance(row, dict):
            raise TraceError(
                f"{p}: line {line_no + 1} holds {type(row).__name__}; accepted: a JSON object"
            )
        rows.append(row)
    if not rows:
        raise TraceError(f"{p}: the file is empty; accepted: one JSON object per line")
    return pd.DataFrame.from_records(rows)


def require(frame: pd.DataFrame, columns: list[str], source: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise TraceError(
            f"{source}: field {missing[0]!r}: missing column; accepted: columns {columns} "
            f"(the file has {list(frame.columns)})"
        )


def numbers(frame: pd.DataFrame, column: str, source: str) -> np.ndarray:
    """A numeric column as float64; the first non-numeric, missing or infinite cell is an error."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        cell = frame[column].iloc[row]
        cell = cell.item() if isinstance(cell, np.generic) else cell
        raise TraceError(f"{source}: row {row}, field {column!r}: got {cell!r}; accepted: a number")
    return values


def check_times(times: np.ndarray, source: str, field: str, sort: bool, duplicates: bool) -> None:
    """Timestamps must increase: unsorted is an error unless sorting was asked for, equal
    neighbours unless `duplicates` allows them."""
    order = np.argsort(times, kind="stable") if sort else np.arange(times.shape[0])
    t = times[order]
    back = np.flatnonzero(np.diff(t) < 0)
    if back.size:
        row = int(back[0] + 1)
        raise TraceError(
            f"{source}: row {row}, field {field!r}: got {t[row].item()!r} after "
            f"{t[row - 1].item()!r}; accepted: non-decreasing timestamps (or sort=true)"
        )
    same = np.flatnonzero(np.diff(t) == 0)
    if same.size and not duplicates:
        row = int(order[same[0] + 1])
        raise TraceError(
            f"{source}: row {row}, field {field!r}: timestamp {t[same[0] + 1].item()!r} repeats "
            "the previous row's; accepted: strictly increasing timestamps (or duplicates=true)"
        )


def load_table(
    path: str | Path,
    columns: Mapping[str, str] | None = None,
    fmt: str | None = None,
    time_unit: str = "s",
    sort: bool = False,
    duplicates: bool = False,
    client: str | None = None,
) -> Trace:
    """A generic table. `columns` maps the trace's fields (arrival, prompt_len, output_len and
    optionally client, request_id) to the file's column names; arrival times are in `time_unit`
    (s, ms, us) and shifted to start at 0. Without a client column every row gets `client` (or
    the file's stem)."""
    source = str(path)
    mapping = {"arrival": "arrival", "prompt_len": "prompt_len", "output_len": "output_len"}
    mapping.update(columns or {})
    unknown = set(mapping) - {"arrival", "prompt_len", "output_len", "client", "request_id"}
    if unknown:
        raise TraceError(
            f"{source}: column mapping {sorted(unknown)} unknown; accepted keys: arrival, "
            "prompt_len, output_len, client, request_id"
        )
    if time_unit not in TIME_UNITS:
        raise TraceError(f"{source}: time_unit {time_unit!r}; accepted: {tuple(TIME_UNITS)}")
    frame = read_table(path, fmt)
    require(frame, list(mapping.values()), source)
    times = numbers(frame, mapping["arrival"], source) * TIME_UNITS[time_unit]
    check_times(times, source, mapping["arrival"], sort, duplicates)
    return _trace(frame, mapping, times, source, sort, client or Path(path).stem)


def _trace(
    frame: pd.DataFrame,
    mapping: Mapping[str, str],
    times: np.ndarray,
    source: str,
    sort: bool,
    client: str,
    **extra: object,
) -> Trace:
    clients = (
        frame[mapping["client"]].astype(str).to_numpy(dtype=object)
        if "client" in mapping
        else np.full(len(frame), client, dtype=object)
    )
    # token counts checked under the file's own column names
    prompt, output = (
        int_column(frame[mapping[f]].to_numpy(), mapping[f], source, 1)
        for f in ("prompt_len", "output_len")
    )
    return Trace.from_columns(
        request_id=frame[mapping["request_id"]].to_numpy() if "request_id" in mapping else None,
        client=clients,
        arrival=times - times.min(),
        prompt_len=prompt,
        output_len=output,
        source=source,
        sort=sort,
        **extra,  # type: ignore[arg-type]
    )


def load_azure(
    path: str | Path, sort: bool = False, duplicates: bool = False, client: str = "azure"
) -> Trace:
    """Azure LLM inference 2023 (TIMESTAMP with 7 fractional digits, ContextTokens,
    GeneratedTokens); times are seconds since the first timestamp, exact to the 100 ns tick."""
    source = str(path)
    frame = read_table(path, "csv")
    require(frame, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], source)
    text = frame["TIMESTAMP"].astype(str)
    stamps = pd.to_datetime(text, errors="coerce", format="%Y-%m-%d %H:%M:%S.%f")
    bad = stamps.isna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        raise TraceError(
            f"{source}: row {row}, field 'TIMESTAMP': got {frame['TIMESTAMP'].iloc[row]!r}; "
            "accepted: 'YYYY-MM-DD HH:MM:SS.fffffff'"
        )
    ns = stamps.to_numpy().astype("datetime64[ns]").astype(np.int64)
    times = (ns - ns.min()) / 1e9
    check_times(times, source, "TIMESTAMP", sort, duplicates)
    mapping = {"prompt_len": "ContextTokens", "output_len": "GeneratedTokens"}
    return _trace(frame, mapping, times, source, sort, client)


def load_vidur(
    path: str | Path, sort: bool = False, duplicates: bool = False, client: str = "vidur"
) -> Trace:
    """Vidur's trace format: arrived_at (s), num_prefill_tokens, num_decode_tokens."""
    return load_table(
        path,
        {
            "arrival": "arrived_at",
            "prompt_len": "num_prefill_tokens",
            "output_len": "num_decode_tokens",
        },
        "csv",
        sort=sort,
        duplicates=duplicates,
        client=client,
    )


def load_vtc_real(path: str | Path, sort: bool = False, duplicates: bool = False) -> Trace:
    """The VTC real-trace CSV (req_id, arrival_s, client, prompt_len, output_len)."""
    return load_table(
        path,
        {
            "request_id": "req_id",
            "arrival": "arrival_s",
            "client": "client",
            "prompt_len": "prompt_len",
            "output_len": "output_len",
        },
        "csv",
        sort=sort,
        duplicates=duplicates,
    )


def load_mooncake(
    path: str | Path, sort: bool = False, duplicates: bool = True, client: str = "mooncake"
) -> Trace:
    """Mooncake-style JSONL: `timestamp` (ms), `input_length`, `output_length`, optional
    `hash_ids` (the prompt's KV block hashes, kept for prefix-cache work). Mooncake traces have
    many requests per millisecond, so equal timestamps are allowed by default."""
    source = str(path)
    frame = read_table(path, "jsonl")
    require(frame, ["timestamp", "input_length", "output_length"], source)
    times = numbers(frame, "timestamp", source) / 1e3
    check_times(times, source, "timestamp", sort, duplicates)
    hashes = None
    if "hash_ids" in frame.columns:
        hashes = np.empty(len(frame), dtype=object)
        for row, ids in enumerate(frame["hash_ids"].tolist()):
            if not isinstance(ids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in ids
            ):
                raise TraceError(
                    f"{source}: row {row}, field 'hash_ids': got {ids!r}; accepted: a list of "
                    "integers"
                )
            hashes[row] = np.asarray(ids, dtype=np.int64)
    mapping = {"prompt_len": "input_length", "output_len": "output_length"}
    return _trace(frame, mapping, times, source, sort, client, block_hashes=hashes)


def load_lengths(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Etalon's length-only CSVs (num_prefill_tokens, num_decode_tokens): (prompts, outputs)."""
    source = str(path)
    frame = read_table(path, "csv")
    require(frame, ["num_prefill_tokens", "num_decode_tokens"], source)
    prompt, output = (
        int_column(frame[c].to_numpy(), c, source, 1)
        for c in ("num_prefill_tokens", "num_decode_tokens")
    )
    return prompt, output


def _agentic(path: str | Path, **options: Any) -> Trace:
    from traces.agentic import load_agentic_sessions  # it builds on this module

    return load_agentic_sessions(path, **options)


LOADERS = {
    "agentic": _agentic,
    "azure": load_azure,
    "vidur": load_vidur,
    "vtc_real": load_vtc_real,
    "mooncake": load_mooncake,
    "table": load_table,
}


def load(path: str | Path, fmt: str = "table", **options: object) -> Trace:
    """Load `path` with the named format's loader (`LOADERS`)."""
    loader = LOADERS.get(fmt)
    if loader is None:
        raise TraceError(f"{path}: trace format {fmt!r} unknown; accepted: {tuple(LOADERS)}")
    return loader(path, **options)  # type: ignore[operator]
