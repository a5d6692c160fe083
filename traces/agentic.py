"""The agentic coding sessions (`data:agentic/claude_code_sessions_flat.csv`) as a trace.

Each session (`trace_id`) is one user. Its agents are apps: the main agent is app "main", a
sub-agent is app `subagent_type` (e.g. "Explore"). An agent's calls (`req_idx` 0, 1, ...) are cut
into interactions after every call that ended its turn (`stop` = end_turn): a user prompt, the
tool-use calls it caused, the final answer. A sub-agent's run is its own interaction.

Session start times (the file gives times relative to each session): a Poisson process of
`session_rate` sessions per second, seeded, sessions taken in file order. The first call of an
interaction arrives at session start + `t_abs_s`; in "chained" mode (default) each later call is
sent `think_time_s` seconds after the previous call ends, in "open_loop" mode at session start +
`t_abs_s` as recorded. Output counts of 0 (calls cut off before any token) become 1, since a
call emits at least one token; `sessions` keeps the first N sessions.

With `block_hashes` the prompts carry prefix-cache block ids for `engine=vllm` (64-token blocks,
`n_blocks` per call): a call repeats the first `prefix_blocks_shared_with_prev` ids of its
agent's previous call and gets new ids for the rest. Off by default: the ids of all 49,334 calls
take about 0.4 GB; combine with `sessions`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.files import file_source, numbers, read_table, require, resolve_path
from traces.schema import Trace, TraceError

COLUMNS = [
    "trace_id",
    "agent_id",
    "subagent_type",
    "req_idx",
    "t_abs_s",
    "in_tokens",
    "out_tokens",
    "think_time_s",
    "stop",
]


def load_agentic_sessions(
    path: str | Path,
    session_rate: float = 0.05,
    seed: int = 0,
    mode: str = "chained",
    sessions: int | None = None,
    block_hashes: bool = False,
) -> Trace:
    if mode not in ("chained", "open_loop"):
        raise TraceError(f"mode must be 'chained' or 'open_loop', got {mode!r}")
    if not (np.isfinite(session_rate) and session_rate > 0):
        raise TraceError(f"session_rate must be > 0 sessions/s, got {session_rate!r}")
    p = resolve_path(path, "agentic sessions file")
    df = read_table(p, "csv")
    src = file_source(p, df)
    require(df, COLUMNS, src)
    for col in ("req_idx", "t_abs_s", "in_tokens", "out_tokens"):
        numbers(df, col, src)
    order = pd.unique(df["trace_id"])
    if sessions is not None:
        order = order[:sessions]
        df = df[df["trace_id"].isin(order)]
    df = df.sort_values(["trace_id", "agent_id", "req_idx"], kind="stable")
    start_of = dict(
        zip(order, np.cumsum(np.random.default_rng(seed).exponential(1 / session_rate, len(order))))
    )
    agent = df["trace_id"] + "\0" + df["agent_id"].astype(str)
    new_agent = agent.ne(agent.shift())
    turn_over = df["stop"].astype(str).eq("end_turn").shift(fill_value=False)
    first = (new_agent | turn_over).to_numpy()
    interaction = np.cumsum(first) - 1
    call = np.arange(len(df)) - np.maximum.accumulate(np.where(first, np.arange(len(df)), 0))
    counts = np.bincount(interaction)
    subagent = df["subagent_type"].astype(object).where(df["subagent_type"].notna(), "subagent")
    app = np.where(df["agent_id"].eq("main"), "main", subagent)
    arrival = df["trace_id"].map(start_of).to_numpy() + df["t_abs_s"].to_numpy(dtype=float)
    hashes = None
    if block_hashes:
        require(df, ["n_blocks", "prefix_blocks_shared_with_prev"], src)
        hashes = _prefix_ids(
            new_agent.to_numpy(),
            numbers(df, "n_blocks", src).astype(np.int64),
            numbers(df, "prefix_blocks_shared_with_prev", src).astype(np.int64),
        )
    think = None
    if mode == "chained":
        think = np.where(call > 0, df["think_time_s"].fillna(0.0).to_numpy(dtype=float), 0.0)
    return Trace.from_columns(
        client=df["trace_id"].to_numpy(dtype=object),
        app=app.astype(object),
        arrival=arrival,
        prompt_len=df["in_tokens"].to_numpy(),
        output_len=np.maximum(df["out_tokens"].to_numpy(), 1),
        optional={
            "interaction_id": interaction,
            "call_index": call,
            "num_calls": counts[interaction],
        },
        think_time=think,
        block_hashes=hashes,
        hash_block_tokens=64,
        source=src,
        sort=True,
    )


def _prefix_ids(new_agent: np.ndarray, blocks: np.ndarray, shared: np.ndarray) -> list[np.ndarray]:
    """Per call, its prompt's block ids: the shared prefix of the agent's previous call, then
    fresh ids (an agent's first call shares nothing)."""
    out: list[np.ndarray] = []
    fresh = 0
    prev = np.empty(0, dtype=np.int64)
    for first, n, s in zip(new_agent.tolist(), blocks.tolist(), shared.tolist(), strict=True):
        keep = 0 if first else min(s, n, prev.shape[0])
        ids = np.concatenate([prev[:keep], np.arange(fresh, fresh + n - keep, dtype=np.int64)])
        fresh += n - keep
        out.append(ids)
        prev = ids
    return out
