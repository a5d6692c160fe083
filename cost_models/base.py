"""The step-time seam: how long one GPU step takes. (Fairness *service* prices live elsewhere.)"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class StepCostModel(Protocol):
    def prefill_time(self, prompt_lens: np.ndarray) -> float:
        """Seconds for one prefill-only step over requests with these prompt lengths."""
        ...

    def decode_times(self, batch_size: int, context_tokens: np.ndarray) -> np.ndarray:
        """Seconds of consecutive decode steps of `batch_size` requests.

        `context_tokens[j]` is the KV tokens the batch attends to in step j. The engine calls this
        once per fast-forward run (and with one element when stepping), so implementations must be
        element-wise: the same step gets the same time however many steps are asked for at once.
        """
        ...

    def decode_time(self, batch_size: int, context_tokens: int) -> float:
        """Seconds of one decode step: exactly `decode_times(batch_size, [context_tokens])[0]`
        (the engine's hot path when it steps one at a time)."""
        ...
