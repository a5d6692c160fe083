"""Readers for real trace files: every format becomes one validated `Trace`.

Formats: the Azure LLM inference 2023 CSVs, Vidur's trace CSV, the VTC real trace, Mooncake-style
JSONL, Etalon's length-only CSVs, the agentic coding sessions, and any CSV / Parquet / JSONL table
with a column mapping (files are read by traces/files.py). Every error is a
`TraceError` naming the file, the row (0-based data row, header excluded) and the field, and
saying what is accepted. Timestamps must increase strictly unless `sort=True` (sort them) or
`duplicates=True` (equal timestamps allowed).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.agentic import load_agentic_sessions
from traces.files import file_source, numbers, read_table, require
from traces.schema import Trace, TraceError, int_column, position

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def check_times(times: np.ndarray, source: str, field: str, sort: bool, duplicates: bool) -> None:
    """Timestamps must increase: unsorted is an error unless sorting was asked for, equal
    neighbours unless `duplicates` allows them."""
    order = np.argsort(times, kind="stable") if sort else np.arange(times.shape[0])
    t = times[order]
    back = np.flatnonzero(np.diff(t) < 0)
    if back.size:
        k = int(back[0] + 1)
        where = position(source, int(order[k]))
        raise TraceError(
            f"{source}: {where}, field {field!r}: got {t[k].item()!r} after "
            f"{t[k - 1].item()!r}; accepted: non-decreasing timestamps (or sort=true)"
        )
    same = np.flatnonzero(np.diff(t) == 0)
    if same.size and not duplicates:
        where, repeated = position(source, int(order[same[0] + 1])), t[same[0] + 1].item()
        raise TraceError(
            f"{source}: {where}, field {field!r}: timestamp {repeated!r} repeats "
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
    optionally client, request_id, slo_class, client_timeout: seconds after its send at which
    each request's client gives up) to the file's column names; arrival times are in
    `time_unit` (s, ms, us) and shifted to start at 0. Without a client column every row gets
    `client` (or the file's stem)."""
    source = str(path)
    mapping = {"arrival": "arrival", "prompt_len": "prompt_len", "output_len": "output_len"}
    mapping.update(columns or {})
    accepted = (
        "arrival",
        "prompt_len",
        "output_len",
        "client",
        "request_id",
        "slo_class",
        "client_timeout",
    )
    unknown = set(mapping) - set(accepted)
    if unknown:
        raise TraceError(
            f"{source}: column mapping {sorted(unknown)} unknown; accepted keys: "
            + ", ".join(accepted)
        )
    if time_unit not in TIME_UNITS:
        raise TraceError(f"{source}: time_unit {time_unit!r}; accepted: {tuple(TIME_UNITS)}")
    frame = read_table(path, fmt)
    source = file_source(path, frame)
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
        slo_class=(
            frame[mapping["slo_class"]].astype(str).to_numpy(dtype=object)
            if "slo_class" in mapping
            else None
        ),
        client_timeout=(
            frame[mapping["client_timeout"]].to_numpy() if "client_timeout" in mapping else None
        ),
        source=source,
        sort=sort,
        **extra,  # type: ignore[arg-type]
    )


def load_azure(
    path: str | Path, sort: bool = False, duplicates: bool = False, client: str = "azure"
) -> Trace:
    """Azure LLM inference 2023 (TIMESTAMP with 7 fractional digits, ContextTokens,
    GeneratedTokens); times are seconds since the first timestamp, exact to the 100 ns tick."""
    frame = read_table(path, "csv")
    source = file_source(path, frame)
    require(frame, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], source)
    text = frame["TIMESTAMP"].astype(str)
    stamps = pd.to_datetime(text, errors="coerce", format="%Y-%m-%d %H:%M:%S.%f")
    bad = stamps.isna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        got = frame["TIMESTAMP"].iloc[row]
        raise TraceError(
            f"{source}: {position(source, row)}, field 'TIMESTAMP': got {got!r}; "
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
    frame = read_table(path, "jsonl")
    source = file_source(path, frame)
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
                    f"{source}: {position(source, row)}, field 'hash_ids': got {ids!r}; "
                    "accepted: a list of integers"
                )
            hashes[row] = np.asarray(ids, dtype=np.int64)
    mapping = {"prompt_len": "input_length", "output_len": "output_length"}
    return _trace(frame, mapping, times, source, sort, client, block_hashes=hashes)


def load_lengths(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Etalon's length-only CSVs (num_prefill_tokens, num_decode_tokens): (prompts, outputs)."""
    frame = read_table(path, "csv")
    source = file_source(path, frame)
    require(frame, ["num_prefill_tokens", "num_decode_tokens"], source)
    prompt, output = (
        int_column(frame[c].to_numpy(), c, source, 1)
        for c in ("num_prefill_tokens", "num_decode_tokens")
    )
    return prompt, output


def _agentic(path: str | Path, **options: Any) -> Trace:
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
