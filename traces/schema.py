"""The request schema: one validated, columnar `Trace` that every engine and metric reads.

Rows are kept sorted by (arrival, request_id) so that "row index" is also the FCFS order; every
error names the source, the row and the field, and says what is accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OPTIONAL_INT_COLUMNS = ("interaction_id", "call_index", "num_calls", "system_prompt_len")
# a request's SLO class, with its priority as an inference gateway reads it (the Gateway API
# inference extension's: the higher the more important, a negative one may be shed)
SLO_PRIORITY = {"critical": 1, "standard": 0, "sheddable": -1, "batch": -2, "background": -3}
SLO_CLASSES = tuple(SLO_PRIORITY)  # `Trace.slo_class` holds codes into this
# the source of a live session's trace (simulator/engines/live.py): its rows are written as
# requests arrive, so nothing per row can be derived from it up front
LIVE_SOURCE = "<live>"


class TraceError(ValueError):
    """A trace or workload setting that cannot be used; the message names the source (file or
    workload), the row and field where there is one, and what is accepted."""


class FileSource(str):
    """A trace file's name that also knows where each row of its table sits in the file, so an
    error names the file's line (CSV, JSONL) or its 1-based row (Parquet) the way an editor
    shows it. A plain string source (columns given in Python) names the 0-based row index."""

    lines: np.ndarray | None

    def __new__(cls, name: str, lines: np.ndarray | None = None) -> FileSource:
        obj = super().__new__(cls, name)
        obj.lines = lines
        return obj


def position(source: str, row: int) -> str:
    """Where row `row` (0-based, in the order read) of a source is: 'line 17' or 'row 3'."""
    if isinstance(source, FileSource):
        return f"line {int(source.lines[row])}" if source.lines is not None else f"row {row + 1}"
    return f"row {row}"


def _fail(source: str, row: int | None, fieldname: str, got: object, accepted: str) -> TraceError:
    where = f"{source}: " + (f"{position(source, row)}, " if row is not None else "")
    return TraceError(f"{where}field '{fieldname}': got {got!r}; accepted: {accepted}")


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def int_column(values: object, name: str, source: str, minimum: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise _fail(source, None, name, f"shape {arr.shape}", "a 1-D column")
    if arr.dtype.kind not in "iubf":
        # strings or objects: the first cell that is not a number fails; the rest as floats
        cells = arr.tolist()
        try:
            arr = np.asarray([float(v) for v in cells], dtype=np.float64)
        except (TypeError, ValueError):
            i = next(i for i, v in enumerate(cells) if not _is_number(v))
            raise _fail(source, i, name, cells[i], f"an integer >= {minimum}") from None
    if arr.dtype.kind == "f":
        # beyond 2^62 a float has no int64 (and no token count is that large)
        bad = ~np.isfinite(arr) | (arr != np.round(arr)) | (np.abs(arr) >= 2.0**62)
        if bad.any():
            i = int(np.argmax(bad))
            raise _fail(source, i, name, arr[i].item(), f"an integer >= {minimum}")
    out = arr.astype(np.int64)
    low = out < minimum
    if low.any():
        i = int(np.argmax(low))
        raise _fail(source, i, name, int(out[i]), f"an integer >= {minimum}")
    return out


def float_column(values: object, name: str, source: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raw = list(np.asarray(values, dtype=object))
        for i, v in enumerate(raw):
            try:
                float(v)
            except (TypeError, ValueError):
                raise _fail(source, i, name, v, "a finite number >= 0 (seconds)") from None
        raise
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise _fail(source, i, name, arr[i].item(), "a finite number >= 0 (seconds)")
    return arr


def timeout_column(values: object, source: str) -> np.ndarray:
    """Client timeouts: seconds > 0 each, inf where the client never gives up."""
    accepted = "seconds > 0 (inf: the client never gives up)"
    raw = np.asarray(values, dtype=object).ravel().tolist()
    out = np.empty(len(raw))
    for i, v in enumerate(raw):
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            raise _fail(source, i, "client_timeout", v, accepted) from None
        if not out[i] > 0:  # NaN, 0 or negative
            raise _fail(source, i, "client_timeout", v, accepted)
    return out


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests as numpy columns, sorted by (arrival, request_id).

    `client` holds integer codes into `client_names`; `client_weight` is per client (not per row).
    Optional columns are `None` when the workload has no such notion.
    """

    request_id: np.ndarray
    client: np.ndarray
    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    client_names: tuple[str, ...]
    client_weight: np.ndarray
    app: np.ndarray | None = None
    app_names: tuple[str, ...] = ()
    interaction_id: np.ndarray | None = None
    call_index: np.ndarray | None = None
    num_calls: np.ndarray | None = None
    system_prompt_len: np.ndarray | None = None
    think_time: np.ndarray | None = None  # chained arrivals: see `predecessor`
    block_hashes: np.ndarray | None = None  # object: per row, the prompt's KV block hash ids
    slo_class: np.ndarray | None = None  # int8 codes into SLO_CLASSES
    # per request, seconds after it is sent at which its client gives up (inf: never)
    client_timeout: np.ndarray | None = None
    hash_block_tokens: int = 512  # prompt tokens each block hash id covers (Mooncake: 512)
    source: str = field(default="<trace>", compare=False)

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    @property
    def num_clients(self) -> int:
        return len(self.client_names)

    @property
    def duration(self) -> float:
        return float(self.arrival[-1] - self.arrival[0]) if len(self) else 0.0

    @classmethod
    def from_columns(
        cls,
        *,
        client: Sequence[object] | np.ndarray,
        arrival: Sequence[float] | np.ndarray,
        prompt_len: Sequence[int] | np.ndarray,
        output_len: Sequence[int] | np.ndarray,
        request_id: Sequence[int] | np.ndarray | None = None,
        client_weights: Mapping[str, float] | None = None,
        client_names: Sequence[str] | None = None,
        app: Sequence[object] | np.ndarray | None = None,
        optional: Mapping[str, Sequence[int] | np.ndarray] | None = None,
        think_time: Sequence[float] | np.ndarray | None = None,
        block_hashes: Sequence[np.ndarray] | np.ndarray | None = None,
        slo_class: Sequence[object] | np.ndarray | None = None,
        client_timeout: Sequence[float] | np.ndarray | None = None,
        hash_block_tokens: int = 512,
        source: str = "<trace>",
        sort: bool = False,
    ) -> Trace:
        """Validate raw columns and build a trace.

        `client` may hold names or integers (kept as names); codes follow `client_names` when
        given (so idle clients keep their place), else the order of first appearance.
        Unsorted arrivals are an error unless `sort=True` asks to sort them. `think_time` makes
        the trace chained (needs `interaction_id` and `call_index`; see `predecessor`).
        `slo_class` holds class names (SLO_CLASSES). `client_timeout`: per request, the seconds
        after its send time at which its client gives up (a number > 0, inf for never).
        """
        arrival_arr = float_column(arrival, "arrival", source)
        n = arrival_arr.shape[0]
        cols: dict[str, object] = {
            "client": client,
            "prompt_len": prompt_len,
            "output_len": output_len,
        }
        if request_id is not None:
            cols["request_id"] = request_id
        if app is not None:
            cols["app"] = app
        if think_time is not None:
            cols["think_time"] = think_time
        if block_hashes is not None:
            cols["block_hashes"] = block_hashes
        if slo_class is not None:
            cols["slo_class"] = slo_class
        if client_timeout is not None:
            cols["client_timeout"] = client_timeout
        if int(hash_block_tokens) != hash_block_tokens or hash_block_tokens < 1:
            raise _fail(source, None, "hash_block_tokens", hash_block_tokens, "an integer >= 1")
        for name, values in {**cols, **(optional or {})}.items():
            length = len(values)  # type: ignore[arg-type]
            if length != n:
                raise _fail(source, None, name, f"{length} rows", f"{n} rows, like 'arrival'")
        if n == 0:
            raise TraceError(f"{source}: the trace has no requests; accepted: at least one row")
        ids = (
            np.arange(n, dtype=np.int64)
            if request_id is None
            else int_column(request_id, "request_id", source, 0)
        )
        if np.unique(ids).shape[0] != n:
            u, counts = np.unique(ids, return_counts=True)
            dup = int(u[np.argmax(counts > 1)])
            row = int(np.flatnonzero(ids == dup)[1])
            raise _fail(source, row, "request_id", dup, "unique request ids")
        prompt = int_column(prompt_len, "prompt_len", source, 1)
        output = int_column(output_len, "output_len", source, 1)
        client_codes, names = _codes(client, "client", source, client_names)
        app_codes, app_names = (None, ()) if app is None else _codes(app, "app", source)
        classes = None
        if slo_class is not None:
            classes = _codes(slo_class, "slo_class", source, SLO_CLASSES)[0].astype(np.int8)
        extra = {
            name: int_column(values, name, source, 0) for name, values in (optional or {}).items()
        }
        unknown = set(extra) - set(OPTIONAL_INT_COLUMNS)
        if unknown:
            raise _fail(
                source, None, sorted(unknown)[0], "unknown column", str(OPTIONAL_INT_COLUMNS)
            )
        weights = np.ones(len(names))
        for name, w in (client_weights or {}).items():
            if name not in names:
                raise _fail(source, None, "client_weights", name, f"one of {names}")
            if not (np.isfinite(w) and w > 0):
                raise _fail(source, None, f"client_weights[{name}]", w, "a number > 0")
            weights[names.index(name)] = float(w)

        back = np.flatnonzero(np.diff(arrival_arr) < 0)
        if back.size and not sort:
            row = int(back[0] + 1)
            raise _fail(
                source,
                row,
                "arrival",
                float(arrival_arr[row]),
                "non-decreasing arrival times (or pass sort=True to sort them)",
            )
        order = np.lexsort((ids, arrival_arr))  # equal times: request_id breaks the tie

        def take(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[order]

        think = None if think_time is None else float_column(think_time, "think_time", source)
        timeout = None
        if client_timeout is not None:
            timeout = timeout_column(client_timeout, source)
        if think is not None:
            _check_chains(extra.get("interaction_id"), extra.get("call_index"), source)
        return cls(
            request_id=ids[order],
            client=client_codes[order],
            arrival=arrival_arr[order],
            prompt_len=prompt[order],
            output_len=output[order],
            client_names=names,
            client_weight=weights,
            app=take(app_codes),
            app_names=app_names,
            interaction_id=take(extra.get("interaction_id")),
            call_index=take(extra.get("call_index")),
            num_calls=take(extra.get("num_calls")),
            system_prompt_len=take(extra.get("system_prompt_len")),
            think_time=take(think),
            block_hashes=None if block_hashes is None else _object_column(block_hashes)[order],
            slo_class=take(classes),
            client_timeout=take(timeout),
            hash_block_tokens=int(hash_block_tokens),
            source=source,
        )

    def client_of(self, name: str) -> int:
        return self.client_names.index(name)

    @property
    def chained(self) -> bool:
        return self.think_time is not None

    def predecessor(self) -> np.ndarray:
        """Per row, the row it waits for (-1: none). In a chained trace a call with
        `call_index` k > 0 is sent `think_time` seconds after call k - 1 of its interaction
        ends (completes, or is rejected or refused), so its `arrival` column is not used; in an
        open-loop trace every request arrives at its `arrival`."""
        before = np.full(len(self), -1, dtype=np.int64)
        if self.think_time is None:
            return before
        assert self.interaction_id is not None and self.call_index is not None
        order = np.lexsort((self.call_index, self.interaction_id))
        follows = (np.diff(self.interaction_id[order]) == 0) & (self.call_index[order][1:] > 0)
        before[order[1:][follows]] = order[:-1][follows]
        return before

    def take(self, rows: np.ndarray, **columns: Any) -> Trace:
        """The trace restricted to `rows` (which must keep the time order), with any field
        replaced by a value in `columns` (per-row columns already restricted)."""
        per_row = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), np.ndarray) and f.name != "client_weight"
        }
        new = {k: v[rows] for k, v in per_row.items() if k not in columns}
        out = dataclasses.replace(self, **new, **columns)
        if out.think_time is not None:
            _check_chains(out.interaction_id, out.call_index, self.source)
        if np.any(np.diff(out.arrival) < 0):
            raise ValueError("Trace.take: rows must keep arrival order")
        return out

    def open_loop(self) -> Trace:
        """The same requests, each sent at its `arrival` time (chaining dropped)."""
        return dataclasses.replace(self, think_time=None)


def _object_column(values: Sequence[object] | np.ndarray) -> np.ndarray:
    """A 1-D object column, even when every row holds a list of the same length."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = np.asarray(v, dtype=np.int64)
    return out


def _check_chains(interaction: np.ndarray | None, call: np.ndarray | None, source: str) -> None:
    """A chained trace needs interactions whose calls are numbered 0, 1, ... without gaps."""
    for name, col in (("interaction_id", interaction), ("call_index", call)):
        if col is None:
            raise _fail(source, None, name, "missing", "a column when 'think_time' is given")
    assert interaction is not None and call is not None
    order = np.lexsort((call, interaction))
    first = np.concatenate(([True], np.diff(interaction[order]) != 0))
    expected = np.arange(order.shape[0]) - np.maximum.accumulate(
        np.where(first, np.arange(order.shape[0]), 0)
    )
    bad = np.flatnonzero(call[order] != expected)
    if bad.size:
        row = int(order[bad[0]])
        raise _fail(
            source,
            row,
            "call_index",
            int(call[row]),
            f"calls of interaction {int(interaction[row])} numbered 0, 1, 2, ... without gaps "
            f"or repeats (expected {int(expected[bad[0]])})",
        )


def _codes(
    values: object, name: str, source: str, known: Sequence[str] | None = None
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map labels to integer codes: `known` order if given, else order of first appearance."""
    raw = np.asarray(values)
    if raw.ndim != 1:
        raise _fail(source, None, name, f"shape {raw.shape}", "a 1-D column")
    labels = [str(v) for v in raw.tolist()]
    for i, v in enumerate(labels):
        if v == "" or v.lower() == "nan":
            raise _fail(source, i, name, v, "a non-empty label")
    if known is not None:
        index = {str(k): i for i, k in enumerate(known)}
        for i, v in enumerate(labels):
            if v not in index:
                raise _fail(source, i, name, v, f"one of {tuple(index)}")
        return np.fromiter((index[v] for v in labels), np.int64, len(labels)), tuple(index)
    names: dict[str, int] = {}
    codes = np.fromiter((names.setdefault(v, len(names)) for v in labels), np.int64, len(labels))
    return codes, tuple(names)
