"""FairServe (the FairServe paper and its artifact): WSC counters, interaction preference, OIT.

Users are the trace's clients; apps, interactions, call indices and system prompts come from the
trace (a request without an interaction is an interaction of one call; without an app, every
user is in one app). A call is the last of its interaction when call_index = num_calls - 1.

WSC: one counter per user with VTC's counter lift. Charge forms (`charge`):
- "paper" (default): per app a and stage j (the call index), w_aj = alpha E[N_I] + beta E[N_S]
  + gamma E[N_O]; a call costs E_i (alpha L_I + beta L_S + gamma L_O) / w_aj, charged as it is
  served: the prompt as it is computed (the system prompt first), the prefill's first token at
  admission, each later token at its step.
- "completion": the artifact's `expect` form, once at completion: E_i (L_I + L_S + 2 L_O) /
  (avg_I + avg_S + 2 avg_O) with per-app averages (no stage).
- "incremental": the artifact's other form: E_i (L_I / P_I + L_S / P_S) for the prompt and
  E_i 2 / P_O per output token (the prefill's first one at admission), P_* the per-app averages.
L_I is the prompt without its system part. Expectations are the trace's means per (app, stage)
or per app, unless `app_stats` gives them ({app: {input, system, output}}, used for every stage).

Throttling (`throttle`): "none" (FS(W)); "always": the user / app limits checked at every arrival
(FS(W+L)); "overload": checked only when the picked request fails the fit test (OIT; FS(W+O) and
FairServe). The rule: the user's arrivals in the `window` seconds before (and not counting) its
latest arrival reach `user_limit` -> "user_limit"; else the app's arrivals against `app_limit`
-> "app_limit". Every arrival counts, throttled or not. With `first_call_only` only first calls
are tested; with `drop_rest` a throttled interaction's later calls are dropped when they reach
the head of the queue ("interaction_throttled").
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping

import numpy as np

from policies.base import BasePolicy
from policies.charging import sequential_sum
from policies.rpm import RPM
from policies.vtc import LIFTS, LeastServed
from simulator.core.counters import ADMIT, COMPLETE, DECODE, PROMPT
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.seam import (
    Admission,
    Charge,
    Drop,
    Finished,
    OutputTokens,
    PromptTokens,
    Verdict,
)
from traces.schema import LIVE_SOURCE, Trace

CHARGES = ("paper", "completion", "incremental")
THROTTLES = ("none", "always", "overload")


def interactions(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request: (interaction key, call index, calls in the interaction). Without interaction
    columns every request is its own one-call interaction; `num_calls` missing is counted."""
    n = len(trace)
    if trace.interaction_id is None:
        return -1 - np.arange(n, dtype=np.int64), np.zeros(n, np.int64), np.ones(n, np.int64)
    ids = trace.interaction_id
    call = np.zeros(n, np.int64) if trace.call_index is None else trace.call_index
    if trace.num_calls is not None:
        return ids, call, trace.num_calls
    _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    return ids, call, counts[inverse].astype(np.int64)


def app_codes(trace: Trace) -> np.ndarray:
    return np.zeros(len(trace), np.int64) if trace.app is None else trace.app


def token_parts(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(L_I without the system prompt, L_S, L_O) per request, as floats."""
    system = (
        np.zeros(len(trace))
        if trace.system_prompt_len is None
        else np.minimum(trace.system_prompt_len, trace.prompt_len).astype(np.float64)
    )
    return trace.prompt_len - system, system, trace.output_len.astype(np.float64)


class FairServe(LeastServed):
    name = "fairserve"
    # charged as served, nothing ahead: a request that leaves early has nothing to settle
    charged = frozenset({PromptTokens, OutputTokens, Finished})

    def __init__(
        self,
        charge: str = "paper",
        alpha: float = 1.0,
        beta: float = 2.0,
        gamma: float = 1.0,
        priority: Mapping[str, float] | None = None,
        app_stats: Mapping[str, Mapping[str, float]] | None = None,
        lift: str = "paper",
        throttle: str = "overload",
        first_call_only: bool = True,
        drop_rest: bool = True,
        interaction_preference: bool = True,
        user_limit: int = 10,
        app_limit: int = 2000,
        window: float = 60.0,
        victim: str = "fcfs",
    ) -> None:
        if charge not in CHARGES:
            raise ConfigError(f"policy.charge must be one of {CHARGES}, got {charge!r}")
        if throttle not in THROTTLES:
            raise ConfigError(f"policy.throttle must be one of {THROTTLES}, got {throttle!r}")
        if lift not in LIFTS:
            raise ConfigError(f"policy.lift must be one of {LIFTS}, got {lift!r}")
        for key, v in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
            if not (np.isfinite(v) and v >= 0):
                raise ConfigError(f"policy.{key} must be a number >= 0, got {v!r}")
        if not gamma > 0:
            raise ConfigError("policy.gamma must be > 0 (every call has output tokens)")
        for key, v in (("user_limit", user_limit), ("app_limit", app_limit)):
            if int(v) != v or v < 1:
                raise ConfigError(f"policy.{key} must be an integer >= 1, got {v!r}")
        if not window > 0:
            raise ConfigError(f"policy.window must be > 0 seconds, got {window!r}")
        self.charge_form, self.lift, self.throttle = charge, lift, throttle
        self.alpha, self.beta, self.gamma = float(alpha), float(beta), float(gamma)
        self.priority = dict(priority or {})
        self.app_stats = {k: dict(v) for k, v in (app_stats or {}).items()}
        self.first_call_only, self.drop_rest = first_call_only, drop_rest
        self.interaction_preference = interaction_preference
        self.user_limit, self.app_limit, self.window = int(user_limit), int(app_limit), window
        self.name = self._variant()
        self.victim_rule = self._check_victim(victim)

    def _variant(self) -> str:
        """The paper's name for this combination of switches (printouts, counters)."""
        full = self.first_call_only and self.drop_rest and self.interaction_preference
        if self.throttle == "overload" and full:
            return "fairserve"
        if self.interaction_preference:
            return "fairserve_custom"
        if self.throttle == "none":
            return "fs_w"
        if not (self.first_call_only or self.drop_rest):
            return "fs_wl" if self.throttle == "always" else "fs_wo"
        return "fairserve_custom"

    # ---- set-up -------------------------------------------------------------------------
    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        self.user = trace.client
        self.app = app_codes(trace)
        self.interaction, self.call, _ = interactions(trace)
        self.factor = self._priority_factors(trace)
        self._check_app_stats(trace)
        # live mode: rows are written as requests arrive, so each row is priced on arrival
        self.live = trace.source == LIVE_SOURCE
        n = len(trace)
        self.token_charge, self.complete_charge = np.zeros(n), np.zeros(n)
        self.system_price, self.input_price = np.zeros(n), np.zeros(n)
        if not self.live:
            self._set_prices(np.arange(n))
        self.prompt_done = np.zeros(n, dtype=np.int64)  # prompt tokens charged
        self.admitted = np.zeros(n, dtype=bool)
        self.user_arrivals: list[list[float]] = [[] for _ in range(trace.num_clients)]
        napps = max(len(trace.app_names), int(self.app.max()) + 1)
        self.app_arrivals: list[list[float]] = [[] for _ in range(napps)]
        self.throttled: set[int] = set()  # interactions with a throttled call
        # interaction preference: waiting later calls, by whether their interaction has started
        self.started: set[int] = set()  # interactions with an admitted call
        self.pending: dict[int, list[int]] = {}  # not started: interaction -> waiting calls
        self.ready: dict[int, list[int]] = {}  # started: user -> waiting calls, arrival order

    def _priority_factors(self, trace: Trace) -> np.ndarray:
        factor = np.ones(trace.num_clients)
        for name, e in self.priority.items():
            if name not in trace.client_names:
                raise ConfigError(f"policy.priority: unknown user {name!r}")
            if not (np.isfinite(e) and e > 0):
                raise ConfigError(f"policy.priority[{name}] must be a number > 0, got {e!r}")
            factor[trace.client_names.index(name)] = float(e)
        return factor

    def _check_app_stats(self, trace: Trace) -> None:
        names = trace.app_names or ("default",)
        for name, stats in self.app_stats.items():
            if name not in names:
                raise ConfigError(f"policy.app_stats: unknown app {name!r}; apps are {list(names)}")
            missing = [k for k in ("input", "system", "output") if k not in stats]
            if missing:
                raise ConfigError(
                    f"policy.app_stats[{name}] needs input, system and output, missing {missing}"
                )
        unknown = [a for a in names if a not in self.app_stats]
        if trace.source == LIVE_SOURCE and unknown:
            raise ConfigError(
                f"policy.app_stats: live mode needs the expected lengths of every app (the "
                f"trace's means are unknown before requests arrive); missing {unknown}, e.g. "
                f"policy.app_stats={{{unknown[0]}: {{input: 200, system: 0, output: 200}}}}"
            )

    def _set_prices(self, rows: np.ndarray) -> None:
        """Price these rows: per output token, at completion, per system-prompt and per
        user-input token (each already times the user's E_i)."""
        self.token_charge[rows], self.complete_charge[rows] = self._prices(rows)
        self.system_price[rows], self.input_price[rows] = self._prompt_prices(rows)

    def _expected(self, rows: np.ndarray, by_stage: bool) -> np.ndarray:
        """Per row, the expected (L_I, L_S, L_O) of its app (and stage): the whole trace's means
        unless `app_stats` gives them (live mode: it always does)."""
        trace = self.trace
        out = np.zeros((rows.shape[0], 3))
        if not self.live:
            parts = np.stack(token_parts(trace), axis=1)
            key = self.app * (int(self.call.max()) + 1) + self.call if by_stage else self.app
            _, group = np.unique(key, return_inverse=True)
            sums = np.zeros((group.max() + 1, 3))
            np.add.at(sums, group, parts)
            means = sums / np.bincount(group)[:, None]
            out = means[group][rows]
        names = trace.app_names or ("default",)
        for name, stats in self.app_stats.items():
            given = [float(stats[k]) for k in ("input", "system", "output")]
            out[self.app[rows] == names.index(name)] = given
        return out

    def _prices(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the charge per output token (the first at admission, the others at their
        steps) and at completion (each already times E_i)."""
        li, ls, lo = (x[rows] for x in token_parts(self.trace))
        e = self.factor[self.user[rows]]
        zero = np.zeros(rows.shape[0])
        if self.charge_form == "paper":
            exp = self._expected(rows, by_stage=True)
            w = self.alpha * exp[:, 0] + self.beta * exp[:, 1] + self.gamma * exp[:, 2]
            return e * self.gamma / w, zero
        exp = self._expected(rows, by_stage=False)
        if self.charge_form == "completion":
            w = exp[:, 0] + exp[:, 1] + 2.0 * exp[:, 2]
            return zero, e * (li + ls + 2.0 * lo) / w
        return e * 2.0 / exp[:, 2], zero

    def _prompt_prices(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the price of one system-prompt token and of one user-input token (the
        system prompt comes first)."""
        e = self.factor[self.user[rows]]
        zero = np.zeros(rows.shape[0])
        if self.charge_form == "paper":
            exp = self._expected(rows, by_stage=True)
            w = self.alpha * exp[:, 0] + self.beta * exp[:, 1] + self.gamma * exp[:, 2]
            return e * self.beta / w, e * self.alpha / w
        if self.charge_form == "completion":
            return zero, zero
        exp = self._expected(rows, by_stage=False)
        per_system = np.divide(e, exp[:, 1], out=zero.copy(), where=exp[:, 1] > 0)
        return per_system, np.divide(e, exp[:, 0], out=zero.copy(), where=exp[:, 0] > 0)

    # ---- hooks --------------------------------------------------------------------------
    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        if self.live:  # its row was written just now
            self._set_prices(np.array([req]))
        u = int(self.user[req])
        self._appears(u)
        self.user_arrivals[u].append(now)
        self.app_arrivals[int(self.app[req])].append(now)
        if self.throttle == "always":
            reason = self._limit_rule(req)
            if reason is not None:
                return reason
        self._lift(u, now, queue)
        if self.interaction_preference and self.call[req] > 0:
            key = int(self.interaction[req])
            if key in self.started:
                self.ready.setdefault(u, []).append(req)
            else:
                self.pending.setdefault(key, []).append(req)
        return None

    def _over(self, arrivals: list[float], limit: int) -> bool:
        """At least `limit` arrivals in the window before (not counting) the latest one."""
        latest = arrivals[-1]
        start = bisect_left(arrivals, latest - self.window)
        return len(arrivals) - 1 - start >= limit

    def _limit_rule(self, req: int) -> str | None:
        """The throttling rule `req` breaks (None: none), marking its interaction throttled."""
        if self.first_call_only and self.call[req] > 0:
            return None
        reason = None
        if self._over(self.user_arrivals[int(self.user[req])], self.user_limit):
            reason = "user_limit"
        elif self._over(self.app_arrivals[int(self.app[req])], self.app_limit):
            reason = "app_limit"
        if reason is not None and self.drop_rest:
            self.throttled.add(int(self.interaction[req]))
        return reason

    def _leaves(self, req: int) -> None:
        """`req` leaves the queue (admitted or dropped): forget it as a preferred call."""
        if self.interaction_preference and self.call[req] > 0:
            key, u = int(self.interaction[req]), int(self.user[req])
            for calls in (self.ready.get(u), self.pending.get(key)):
                if calls and req in calls:
                    calls.remove(req)

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        """The least-served user's next call of a started interaction, if any waits (the
        interaction preference); else the least-served waiting user's earliest request."""
        if self.interaction_preference:
            mid = [u for u, calls in self.ready.items() if calls]
            if mid:
                return self.ready[self.least_served(mid)][0]
        waiting = queue.waiting_clients()
        return queue.head(self.least_served(waiting)) if waiting else None

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        """A later call of a throttled interaction is dropped; a request that does not fit is
        throttled if it breaks a limit (OIT), else waits."""
        if self.drop_rest and int(self.interaction[req]) in self.throttled:
            self._leaves(req)
            return Drop("interaction_throttled")
        if not fits:
            reason = self._limit_rule(req) if self.throttle == "overload" else None
            if reason is None:
                return Verdict.WAIT
            self._leaves(req)
            return Drop(reason, stop=True)
        if not self.admitted[req]:  # a preempted request resumes without a charge
            self.admitted[req] = True
            self._first_admission(req, now)
        return Verdict.ADMIT

    def _first_admission(self, req: int, now: float) -> None:
        u = int(self.user[req])
        self._leaves(req)
        if self.interaction_preference:
            key = int(self.interaction[req])
            if key not in self.started:
                self.started.add(key)
                for call in self.pending.pop(key, []):
                    insort(self.ready.setdefault(u, []), call)
        if self.token_charge[req]:  # the prefill's token; the prompt is charged as computed
            self._charge(u, float(self.token_charge[req]), now, ADMIT)

    def charge(self, event: Charge) -> None:
        if isinstance(event, OutputTokens):
            self._output_tokens(event.rows, event.clients, event.step_ends)
        elif isinstance(event, PromptTokens):
            self._prompt_tokens(event.req, event.tokens, event.now)
        elif self.complete_charge[event.req]:
            u = int(self.user[event.req])
            self._charge(u, float(self.complete_charge[event.req]), event.now, COMPLETE)

    def _prompt_tokens(self, req: int, tokens: int, now: float) -> None:
        done = int(self.prompt_done[req])
        self.prompt_done[req] = done + tokens
        system = 0 if self.trace.system_prompt_len is None else self.trace.system_prompt_len[req]
        in_system = max(0, min(done + tokens, int(system)) - done)
        price = in_system * self.system_price[req] + (tokens - in_system) * self.input_price[req]
        if price:
            self._charge(int(self.user[req]), float(price), now, PROMPT)

    def _output_tokens(self, rows: np.ndarray, clients: np.ndarray, step_ends: np.ndarray) -> None:
        if self.charge_form == "completion":
            return
        prices = self.token_charge[rows]
        for u in np.unique(clients).tolist():
            per_step = 0.0
            for price in prices[clients == u].tolist():  # running order: chunking never matters
                per_step += price
            incs = np.full(step_ends.shape[0], per_step)
            values = sequential_sum(float(self.counter[u]), incs)
            self.counter[u] = values[-1]
            self.log.add_many(step_ends, u, incs, values, DECODE)


class RPMInteraction(BasePolicy):
    """The FairServe paper's RPM baseline: a per-user limit on accepted calls in a sliding
    window (as `rpm`), and once one call of an interaction is rejected the interaction's later
    calls are rejected on arrival ("interaction_aborted"). Accepted calls are served FCFS."""

    runs_live = True

    name = "rpm_interaction"

    def __init__(self, limit: int = 10, window: float = 60.0) -> None:
        self._rpm = RPM(limit, window)

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        self._rpm.bind(trace)
        self.interaction, _, _ = interactions(trace)
        self.aborted: set[int] = set()

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        key = int(self.interaction[req])
        if key in self.aborted:
            return "interaction_aborted"
        reason = self._rpm.on_arrival(req, now, queue)
        if reason is not None:
            self.aborted.add(key)
        return reason

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        return queue.oldest()
