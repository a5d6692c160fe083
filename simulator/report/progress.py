"""Progress during long runs: a text progress bar plus Veeksha-style streaming metrics.

The engine calls the reporter about once a second of wall time with a `ProgressSnapshot`; the
reporter prints one line to stderr, e.g.
`[####------] 41%  t=152.0s  Completed: 812/2000 | TTFT p99: 0.412s | Throughput: 1834 tok/s`,
and a last line at 100% when the run ends. Throughput is the summary's: prompt + output tokens of
the requests completed so far over the time of the last finish.
"""

from __future__ import annotations

import sys
from typing import TextIO

import numpy as np

from simulator.engines import ProgressSnapshot

BAR_WIDTH = 20


class StreamingReporter:
    """Prints one progress line per call (metrics over requests completed so far)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def __call__(self, snap: ProgressSnapshot) -> None:
        print(progress_line(snap), file=self.stream or sys.stderr, flush=True)


def progress_line(snap: ProgressSnapshot) -> str:
    share = snap.finished / snap.total if snap.total and not snap.done else 1.0
    filled = int(round(share * BAR_WIDTH))
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    done = ~np.isnan(snap.finished_at)
    ttft = snap.first_token_at[done] - snap.arrival[done]
    p99 = f"{np.percentile(ttft, 99):.3f}s" if ttft.size else "-"
    last = snap.finished_at[done].max() if done.any() else 0.0
    tokens = snap.prompt_len[done].sum() + snap.output_len[done].sum()
    rate = tokens / last if last > 0 else 0.0
    end = "  (run ended)" if snap.done else ""
    return (
        f"[{bar}] {100 * share:3.0f}%  t={snap.now:.1f}s  Completed: {done.sum()}/{snap.total}"
        f" | TTFT p99: {p99} | Throughput: {rate:.0f} tok/s{end}"
    )
