"""S-LoRA's admission fit test, in a closed form that avoids re-sorting per candidate.

The test: for each running request take (current, remaining) = (prompt + generated,
output - generated - 1), add each newcomer as (prompt + 1, output - 1), sort by remaining
descending (stable: running first, newcomers in order), and need = max_i(remaining_i * i +
sum_{k<=i} current_k); admit iff need < pool - reserve.

Closed form: write a running request's terms with its finish step fd (the decode count at which
it emits its last token): remaining = fd - D - 1 and current = (prompt - first_decode) + D + 1,
with D the decode steps so far. Then term_i = S_i + i * fd_i with S_i = sum_{k<=i}(prompt_k -
first_decode_k): independent of D. A newcomer is the same with a = prompt - D and fd = D + output.
Keeping the requests sorted by fd, one newcomer inserted at position q gives
need = max(max_{i<q} term_i, S_q + a + (q+1) fd, max_{i>=q}(term_i + fd_i) + a).

Several newcomers, sorted the same way (m = 1..k, at positions q_1 <= ... <= q_k, with A_m the
sum of the first m a's): a running request with m newcomers ahead scores term_i + A_m + m fd_i,
and newcomer m scores S_{q_m} + A_m + (q_m + m) fd_m. Each extra newcomer ahead only raises a
running request's score (it adds p + fd_i - D > 0), so the range maximum over the requests between
newcomers m and m+1 can be taken over the whole suffix from q_m:
need = max(max_{i<q_1} term_i, max_m newcomer_m, max_m (A_m + max_{i>=q_m}(term_i + m fd_i))).
The suffix maxima are tabulated per m, on demand; for m >= 2, fd descending gives the bound
max_{i>=q}(term_i + m fd_i) <= table_1[q] + (m - 1) fd_q, and table m is only consulted where that
bound exceeds the need found so far.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

import numpy as np

_NONE = -(2**62)  # "no such request": below any term
_NEVER = 2**62  # above any need


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
    """Fit-test state for a set of running requests.

    It stays valid while requests only finish: the finished ones are those with fd <= D, the
    tail of the fd order, so the live requests are a prefix. Rebuild it when requests join.
    """

    def __init__(self, prompt: np.ndarray, first_decode: np.ndarray, finish: np.ndarray) -> None:
        order = np.argsort(-finish, kind="stable")
        self._offset = prompt[order] - first_decode[order]  # prompt - first_decode
        self._fd = finish[order]
        s = np.cumsum(self._offset)
        self._term = s + np.arange(1, self._fd.shape[0] + 1) * self._fd
        self._neg_fd = (-self._fd).tolist()  # ascending, for bisect (faster than numpy here)
        self._s = [0, *s.tolist()]
        self._fd_list = self._fd.tolist()
        self._prefix_max = [_NONE, *np.maximum.accumulate(self._term).tolist()]
        self._tables_live = -1  # live count the cached suffix tables belong to
        self._tables: dict[int, np.ndarray] = {}
        self._first: list[int] = []
        self._first_live = -1

    def live(self, decodes: int) -> int:
        """How many requests are still running after `decodes` decode steps (fd > decodes)."""
        return bisect_left(self._neg_fd, -decodes)

    def position(self, fd: int) -> int:
        """Where a newcomer with this fd sorts: after every request with fd >= its own.

        A newcomer's fd exceeds every finished request's, so this stays inside the live prefix.
        """
        return bisect_right(self._neg_fd, -fd)

    def suffix_table(self, live: int, m: int) -> np.ndarray:
        """[max_{q<=i<live}(term_i + m fd_i) for q in 0..live-1], cached while `live` holds."""
        if live != self._tables_live:
            self._tables, self._tables_live = {}, live
        table = self._tables.get(m)
        if table is None:
            tail = (self._term[:live] + m * self._fd[:live])[::-1]
            table = self._tables[m] = np.maximum.accumulate(tail)[::-1]
        return table

    def first_table(self, live: int) -> list[int]:
        """suffix_table(live, 1) as a list (every fit test reads it), cached while `live` holds."""
        if self._first_live != live:
            self._first, self._first_live = self.suffix_table(live, 1).tolist(), live
        return self._first

    def batch(self, decodes: int) -> BatchFit:
        return BatchFit(self, decodes)

    def direct_need(self, decodes: int, prompts: np.ndarray, outputs: np.ndarray) -> int:
        """The same need by the direct formula (for very large mini-batches)."""
        live = self.live(decodes)
        current = np.concatenate([self._offset[:live] + decodes + 1, prompts + 1])
        remaining = np.concatenate([self._fd[:live] - decodes - 1, outputs - 1])
        return peak_kv_need(current, remaining)


class BatchFit:
    """The fit test for the members of one mini-batch being formed at decode count D."""

    MAX_CLOSED_FORM = 32  # the closed form costs O(k^2) per batch; beyond, use the direct one

    def __init__(self, fit: RunningFit, decodes: int) -> None:
        self.fit, self.decodes = fit, decodes
        self.live = fit.live(decodes)
        self._first = fit.first_table(self.live)
        self.members: list[tuple[int, int, int, int]] = []  # (-fd, seq, position, a), sorted
        self.lengths: list[tuple[int, int]] = []  # (prompt, output) in admission order
        self.a_total = 0  # sum of the members' a

    def _member(self, prompt: int, output: int) -> tuple[int, int, int, int]:
        fd = self.decodes + output
        seq = len(self.lengths)
        return (-fd, seq, self.fit.position(fd), prompt - self.decodes)

    def add(self, prompt: int, output: int) -> None:
        """Count in an admitted member."""
        member = self._member(prompt, output)
        insort(self.members, member)
        self.a_total += member[3]
        self.lengths.append((prompt, output))

    def need(self, prompt: int, output: int, enough: int | None = None) -> int:
        """Peak need if this candidate joins the members admitted so far.

        With `enough`, the value is exact only in whether it reaches `enough` (the engine only
        compares the need with the pool): it stops early once the need is known to reach it, and
        skips a suffix table whose upper bound stays below it.
        """
        fit, live = self.fit, self.live
        if len(self.members) >= self.MAX_CLOSED_FORM:
            p, o = zip(*self.lengths, (prompt, output), strict=True)
            return fit.direct_need(self.decodes, np.array(p), np.array(o))
        new = self._member(prompt, output)
        members = self.members.copy()
        insort(members, new)
        stop = _NEVER if enough is None else enough
        s, fd, first = fit._s, fit._fd_list, self._first
        need = fit._prefix_max[members[0][2]]
        a_sum = self.a_total + new[3]  # A_m, walking m down from k
        for m in range(len(members), 0, -1):  # the largest m usually decides: bounds prune the rest
            neg_fd, _, q, a = members[m - 1]
            score = s[q] + a_sum - (q + m) * neg_fd
            if score > need:
                need = score
            if q < live:  # running requests behind this newcomer
                if m == 1:
                    score = first[q] + a_sum
                    if score > need:
                        need = score
                else:
                    bound = first[q] + a_sum + (m - 1) * fd[q]
                    if bound > need and (bound >= stop or enough is None):
                        score = int(fit.suffix_table(live, m)[q]) + a_sum
                        if score > need:
                            need = score
            if need >= stop:
                return need
            a_sum -= a
        return need
