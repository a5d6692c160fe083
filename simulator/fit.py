"""S-LoRA's admission fit test, with a fast path for the common single-candidate case.

The test: for each running request take (current, remaining) = (prompt + generated,
output - generated - 1), add each newcomer as (prompt + 1, output - 1), sort by remaining
descending (stable: running first, newcomers in order), and need = max_i(remaining_i * i +
sum_{k<=i} current_k); admit iff need < pool - reserve.

Fast path: write a running request's terms with its finish step fd (the decode count at which it
emits its last token): remaining = fd - D - 1 and current = (prompt - first_decode) + D + 1, with
D the decode steps so far. Then term_i = S_i + i * fd_i with S_i = sum_{k<=i}(prompt_k -
first_decode_k): independent of D. Sorting by fd once per change of the running set, one
newcomer (a = prompt - D, fd = D + output) inserted at position q gives
need = max(max_{i<q} term_i, S_q + a + (q+1) fd, max_{i>=q}(term_i + fd_i) + a).
"""

from __future__ import annotations

import numpy as np


def peak_kv_need(current: np.ndarray, remaining: np.ndarray) -> int:
    """Peak future KV use if every request runs to its full length (the direct formula).

    Sort by remaining tokens, descending; when the i-th request finishes, requests 1..i are all
    still running and have each grown by remaining_i tokens.
    """
    order = np.argsort(-remaining, kind="stable")
    rem = remaining[order]
    held = np.cumsum(current[order])
    return int((rem * np.arange(1, rem.shape[0] + 1) + held).max())


class RunningFit:
    """Fit-test state for one running set (rebuild it whenever the running set changes)."""

    def __init__(self, prompt: np.ndarray, first_decode: np.ndarray, finish: np.ndarray) -> None:
        self.prompt, self.first_decode, self.finish = prompt, first_decode, finish
        order = np.argsort(-finish, kind="stable")
        fd = finish[order]
        s = np.cumsum(prompt[order] - first_decode[order])
        i = np.arange(1, fd.shape[0] + 1)
        term = s + i * fd
        self._neg_fd = -fd  # ascending, for searchsorted
        self._s = np.concatenate(([0], s)).tolist()
        none = -(2**62)  # "no such request": below any term
        self._prefix_max = [none, *np.maximum.accumulate(term).tolist()]
        tail = (term + fd)[::-1]
        self._suffix_max = [*np.maximum.accumulate(tail)[::-1].tolist(), none]

    def need_with(self, decodes: int, prompts: np.ndarray, outputs: np.ndarray) -> int:
        """Peak need if newcomers with these prompt and output lengths join now."""
        if prompts.shape[0] == 1:
            p, o = int(prompts[0]), int(outputs[0])
            fd = decodes + o
            # running requests with fd >= the newcomer's stay ahead of it (stable order)
            q = int(np.searchsorted(self._neg_fd, -fd, side="right"))
            a = p - decodes
            return max(self._prefix_max[q], self._s[q] + a + (q + 1) * fd, self._suffix_max[q] + a)
        gen = decodes - self.first_decode + 1
        current = np.concatenate([self.prompt + gen, prompts + 1])
        remaining = np.concatenate([self.finish - decodes - 1, outputs - 1])
        return peak_kv_need(current, remaining)
