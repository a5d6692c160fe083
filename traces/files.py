"""Reading trace files safely: locating a file, reading CSV / Parquet / JSONL tables, and
checking columns, with errors that name the file, the row and the field.

Shared by every loader (traces/loaders.py, traces/agentic.py, ...). Files are read as UTF-8 text
or Parquet, never unpickled; a CSV or JSONL file may be gzip-compressed (`name.csv.gz`), and a
`data:` path finds `name.csv.gz` where `name.csv` is absent, which is how fairsim ships its
larger tables.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from traces.schema import FileSource, TraceError, position

LINE_INDEX = "line"  # read_table's index: the file line of each row (CSV, JSONL)

TABLE_FORMATS = ("csv", "parquet", "jsonl")
SUFFIX_FORMAT = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl"}
PROJECT_ROOT = Path(__file__).resolve().parents[1]
DATA_SCHEME = "data:"
# the data fairsim ships (each folder with its LICENSE and NOTICE.md)
SHIPPED_DATA = (PROJECT_ROOT / "traces" / "data", PROJECT_ROOT / "cost_models" / "data")


def data_dirs() -> list[Path]:
    """Where a `data:<dataset>/<file>` path is looked up, in order: FAIRSIM_DATA_DIR when set,
    the data shipped with fairsim, and the download cache `fairsim-data get` fills."""
    override = os.environ.get("FAIRSIM_DATA_DIR")
    return [*([Path(override)] if override else []), *SHIPPED_DATA, data_cache()]


def data_cache() -> Path:
    """The user's download cache: $XDG_CACHE_HOME/fairsim/data (default ~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fairsim" / "data"


def resolve_path(path: str | Path, what: str = "trace file") -> Path:
    """`data:<dataset>/<file>` is looked up in `data_dirs()`; a relative path from the working
    directory, then from the project root."""
    text = str(path)
    if text.startswith(DATA_SCHEME):
        relative = text[len(DATA_SCHEME) :].lstrip("/")
        for folder in data_dirs():
            for candidate in (folder / relative, folder / f"{relative}.gz"):
                if candidate.exists():
                    return candidate
        from traces.datasets import datasets  # the manifest is read only when data is missing

        name = relative.split("/", 1)[0]
        get = f"`fairsim-data get {name}` downloads it, or set" if name in datasets() else "set"
        raise TraceError(
            f"{path}: {what} not installed; {get} FAIRSIM_DATA_DIR to a folder holding "
            f"{relative} (or copy it to {data_cache() / relative})"
        )
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
    compressed = p.suffix.lower() == ".gz"
    fmt = fmt or SUFFIX_FORMAT.get((p.with_suffix("") if compressed else p).suffix.lower())
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
        text = _utf8(p, compressed)
        frame = _read_csv(p, text) if fmt == "csv" else _read_jsonl(p, text)
    if len(frame) == 0:
        raise TraceError(f"{p}: the file has no data rows; accepted: at least one row")
    return frame


def file_source(path: str | Path, frame: pd.DataFrame) -> FileSource:
    """The name to give a table read by `read_table` in errors: it names file lines."""
    lines = frame.index.to_numpy() if frame.index.name == LINE_INDEX else None
    return FileSource(str(path), lines)


def _utf8(p: Path, compressed: bool = False) -> str:
    raw = p.read_bytes()
    if compressed:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise TraceError(f"{p}: not a readable gzip file ({err}); accepted: gzip") from None
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
        frame = pd.read_csv(io.StringIO(text))
    except pd.errors.ParserError as err:
        raise TraceError(f"{p}: malformed CSV ({err}); accepted: comma-separated rows") from None
    # pandas skips blank (and whitespace-only) lines; a row's line is then the n-th non-blank
    # line after the header (a quoted field spanning lines would shift this; traces have none)
    filled = [i for i, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if len(filled) - 1 == len(frame):
        frame.index = pd.Index(filled[1:], name=LINE_INDEX)
    return frame


def _read_jsonl(p: Path, text: str) -> pd.DataFrame:
    rows, lines = [], []
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
        lines.append(line_no + 1)
    if not rows:
        raise TraceError(f"{p}: the file is empty; accepted: one JSON object per line")
    return pd.DataFrame.from_records(rows, index=pd.Index(lines, name=LINE_INDEX))


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
        raise TraceError(
            f"{source}: {position(source, row)}, field {column!r}: got {cell!r}; accepted: a number"
        )
    return values
