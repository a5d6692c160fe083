"""Replaying a trace against an OpenAI-compatible endpoint: what each request received, and when.

Requests leave at the trace's arrival times (open loop); a chained call (closed-loop users,
multi-call interactions) leaves `think_time` after its predecessor ends, as in a simulation. At
most `target.max_concurrency` are in flight; one waiting for a slot is sent when it gets one,
and its `sent_at` is then (the trace's time is kept as `scheduled_at`).

Times are seconds on the trace's clock: the first arrival is sent at the trace's first arrival
time, and a target that runs `time_scale` times faster than real time (fairsim-serve's
`serve.time_scale`) has its gaps shrunk on the way out and its measured times stretched back.

Tokens: a chunk carries one token unless a tokenizer (`target.tokenizer`) counts more in its
text; k tokens of one chunk are spread evenly over the time since the chunk before (the last at
the chunk's own arrival; a first chunk's tokens all arrive with it). Whatever arrived before an
error, a timeout or a dropped connection is kept, with the reason.

A request whose trace gives its client a timeout (`client_timeout`: inference-perf's
`load.request_timeout`, or the top-level key) is abandoned that long after it is sent, as in a
simulation: it ends `rejected`, reason `client_timeout`, with the tokens it received
(`target.timeout`, when shorter, fails it first).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import openai
import orjson

from simulator.core.errors import ConfigError
from simulator.core.requests import CLIENT_TIMEOUT, COMPLETED, FAILED, IN_FLIGHT, REJECTED
from simulator.engines import ProgressSnapshot
from simulator.engines.arrivals import chains, first_arrivals
from traces.schema import Trace

ENDPOINTS = ("completions", "chat")
PROMPT_KINDS = ("token_ids", "text")
PROMPT_IDS = (1000, 30000)  # prompt token ids are drawn from this range (inside any vocabulary)
FILLER_WORD = " the"  # one token in BPE vocabularies, and 4 characters (fairsim-serve's estimate)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a request can fail with: the SDK's errors, and those of the HTTP library under it
    (httpx; httpx2 in newer SDKs), which can surface mid-stream."""
    errors: list[type[BaseException]] = [openai.APIError, OSError]
    for name in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(name).HTTPError)
    return tuple(errors)


HTTP_ERRORS = _transport_errors()
DROPPED = ("ReadError", "RemoteProtocolError", "APIConnectionError")  # the server went away


@dataclass
class TargetConfig:
    """The `target:` block of `fairsim-bench`."""

    url: str = "http://127.0.0.1:8000/v1"  # the API's base URL (ends in /v1 for most servers)
    model: str | None = None  # None: the first model GET /models lists
    api_key: str | None = None
    endpoint: str = "completions"  # completions or chat
    prompt: str = "token_ids"  # token_ids (a list of ids as the prompt) or text
    force_output_len: bool = True  # also send min_tokens and ignore_eos (vLLM, SGLang, fairsim)
    max_concurrency: int = 256  # requests in flight at most
    timeout: float = 600.0  # seconds a request may take in all
    stall_timeout: float = 60.0  # seconds without a byte from the server mid-request
    connect_timeout: float = 10.0
    time_scale: float = 1.0  # the target's time runs this many times faster than real time
    tokenizer: str | None = None  # "module:function": text -> token count or ids
    max_failed_share: float = 0.1  # more failed requests than this: exit status 4

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"target.url={self.url!r}: expected an http:// or https:// URL")
        checks = (
            ("endpoint", self.endpoint in ENDPOINTS, f"one of {', '.join(ENDPOINTS)}"),
            ("prompt", self.prompt in PROMPT_KINDS, f"one of {', '.join(PROMPT_KINDS)}"),
            ("max_concurrency", self.max_concurrency >= 1, "an integer >= 1"),
            ("timeout", self.timeout > 0, "a number of seconds > 0"),
            ("stall_timeout", self.stall_timeout > 0, "a number of seconds > 0"),
            ("connect_timeout", self.connect_timeout > 0, "a number of seconds > 0"),
            ("time_scale", self.time_scale > 0, "a number > 0"),
            ("max_failed_share", 0 <= self.max_failed_share <= 1, "a share from 0 to 1"),
        )
        for name, ok, accepted in checks:
            if not ok:
                raise ConfigError(f"target.{name}={getattr(self, name)!r}: expected {accepted}")
        if self.endpoint == "chat" and self.prompt == "token_ids":
            self.prompt = "text"  # chat messages are text


@dataclass
class Received:
    """Per trace row, what the client saw (times on the trace's clock)."""

    scheduled_at: np.ndarray
    sent_at: np.ndarray
    first_token_at: np.ndarray
    finished_at: np.ndarray
    status: np.ndarray  # codes into STATUSES
    reason: np.ndarray  # object: why it did not complete
    http_status: np.ndarray  # 0: no answer
    reported_tokens: np.ndarray  # the server's usage.completion_tokens (-1: not reported)
    tokens: list[list[float]] = field(default_factory=list)  # time of every token received

    @classmethod
    def empty(cls, n: int) -> Received:
        return cls(
            scheduled_at=np.full(n, np.nan),
            sent_at=np.full(n, np.nan),
            first_token_at=np.full(n, np.nan),
            finished_at=np.full(n, np.nan),
            status=np.full(n, IN_FLIGHT, dtype=np.int8),
            reason=np.full(n, "not_sent", dtype=object),
            http_status=np.zeros(n, dtype=np.int64),
            reported_tokens=np.full(n, -1, dtype=np.int64),
            tokens=[[] for _ in range(n)],
        )


def prompt_token_ids(trace: Trace, row: int, seed: int) -> list[int]:
    """Deterministic prompt ids of the row's length. Rows that share KV block hashes
    (Mooncake-style prefix structure) share those blocks' ids, so a prefix cache sees the
    trace's sharing; other prompts share nothing."""
    n = int(trace.prompt_len[row])
    low, high = PROMPT_IDS
    parts: list[np.ndarray] = []
    if trace.block_hashes is not None:
        for h in trace.block_hashes[row]:
            rng = np.random.default_rng([seed, 1, int(h)])
            parts.append(rng.integers(low, high, trace.hash_block_tokens))
    rng = np.random.default_rng([seed, 0, int(trace.request_id[row])])
    parts.append(rng.integers(low, high, n))
    return np.concatenate(parts)[:n].tolist()


def prompt_text(n: int, count_tokens: Callable[[str], int] | None) -> str:
    """Text of n tokens: the filler word n times, adjusted until the tokenizer counts n."""
    words = n
    text = FILLER_WORD * words
    for _ in range(8):
        if count_tokens is None or (got := count_tokens(text)) == n:
            break
        words = max(1, words + n - got)
        text = FILLER_WORD * words
    return text


def chunk_times(previous: float | None, now: float, k: int) -> list[float]:
    """When the k tokens of a chunk that arrived at `now` count as received."""
    if previous is None or k == 1:
        return [now] * k
    return [previous + (now - previous) * (j + 1) / k for j in range(k)]


class Replay:
    """One replay of `trace` against one target (see the module docstring)."""

    def __init__(
        self,
        trace: Trace,
        target: TargetConfig,
        model: str,
        seed: int,
        count_tokens: Callable[[str], int] | None = None,
    ) -> None:
        self.trace, self.target, self.model, self.seed = trace, target, model, seed
        self.count_tokens = count_tokens
        self.received = Received.empty(len(trace))
        self.origin = float(trace.arrival.min()) if len(trace) else 0.0
        self.successor = chains(trace)
        self.row_of = {str(r): i for i, r in enumerate(trace.request_id.tolist())}
        self.ended = 0
        self.error: Exception | None = None  # what stopped the replay, if anything did
        self._start = 0.0  # time.monotonic() when the trace's clock read `origin`

    def now(self) -> float:
        """The trace's clock."""
        return self.origin + (time.monotonic() - self._start) * self.target.time_scale

    def clock(self) -> dict[str, float]:
        """How the run's times map to the monotonic clock (as fairsim-serve's summary says it):
        time t happened at started_monotonic + (t - time_origin) / time_scale."""
        return {
            "started_monotonic": self._start,
            "time_scale": self.target.time_scale,
            "time_origin": self.origin,
        }

    async def _sleep_until(self, t: float) -> None:
        delay = (t - self.now()) / self.target.time_scale
        if delay > 0:
            await asyncio.sleep(delay)

    async def run(self, progress: Callable[[ProgressSnapshot], None] | None = None) -> Received:
        target = self.target
        timeout = openai.Timeout(
            None, connect=target.connect_timeout, read=target.stall_timeout, write=30.0, pool=None
        )
        # sent_at is stamped when the HTTP request leaves (the SDK's own work comes before)
        http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [self._on_send]})
        async with openai.AsyncOpenAI(
            base_url=target.url,
            api_key=target.api_key or "none",
            max_retries=0,
            timeout=timeout,
            http_client=http,
        ) as client:
            self.client = client
            self.slots = asyncio.Semaphore(target.max_concurrency)
            self.all_ended = asyncio.Event()
            self.tasks: set[asyncio.Task[None]] = set()
            self._start = time.monotonic()
            reporter = asyncio.create_task(self._report(progress)) if progress else None
            if len(self.trace) == 0:
                self.all_ended.set()
            for row in first_arrivals(self.trace).tolist():
                at = float(self.trace.arrival[row])
                await self._sleep_until(at)
                self._start_request(row, at)
            await self.all_ended.wait()
            if self.error is not None:
                raise self.error
            if progress is not None and reporter is not None:
                reporter.cancel()
                progress(self._snapshot(done=True))
        return self.received

    def _start_request(self, row: int, at: float) -> None:
        task = asyncio.create_task(self._request(row, at))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _request(self, row: int, at: float) -> None:
        rec = self.received
        rec.scheduled_at[row] = at
        async with self.slots:
            rec.sent_at[row] = self.now()  # until the request actually leaves (_on_send)
            rec.reason[row] = None
            gives_up = self._client_timeout(row)
            try:
                limit = min(self.target.timeout, gives_up) / self.target.time_scale
                await asyncio.wait_for(self._stream(row), limit)
            except asyncio.TimeoutError:
                if gives_up < self.target.timeout:  # the trace's client gave up
                    rec.status[row], rec.reason[row] = REJECTED, CLIENT_TIMEOUT
                    rec.finished_at[row] = self.now()
                else:
                    self._fail(row, FAILED, f"timeout: no end after {self.target.timeout:g} s")
            except openai.APIStatusError as err:
                code = err.status_code
                rec.http_status[row] = code
                message = _error_message(err)
                self._fail(row, REJECTED if code == 429 else FAILED, f"http {code}: {message}")
            except HTTP_ERRORS as err:
                self._fail(row, FAILED, self._describe(err))
            except Exception as err:  # a bug, not the server: stop the replay and report it
                self.error = err
                self.all_ended.set()
                return
        self._ended(row)

    def _client_timeout(self, row: int) -> float:
        """Seconds after sending at which the trace's client of `row` gives up (inf: never)."""
        timeouts = self.trace.client_timeout
        return float("inf") if timeouts is None else float(timeouts[row])

    async def _on_send(self, request: Any) -> None:
        rid = request.headers.get("X-Request-Id")
        row = self.row_of.get(rid) if rid is not None else None
        if row is not None:
            self.received.sent_at[row] = self.now()

    def _describe(self, err: BaseException) -> str:
        """Why a request failed on the way, in words, with the error's own name."""
        name, line = type(err).__name__, _first_line(err)
        detail = name if line == name else f"{name}: {line}"
        if "Timeout" in name:
            stall = self.target.stall_timeout
            return f"stalled: nothing received for {stall:g} s ({detail})"
        if isinstance(err, (ConnectionError, EOFError)) or name in DROPPED:
            return f"connection dropped ({detail})"
        return detail

    def _fail(self, row: int, status: int, reason: str) -> None:
        rec = self.received
        got = len(rec.tokens[row])
        rec.status[row] = status
        rec.reason[row] = f"{reason} (after {got} tokens)" if got else reason
        rec.finished_at[row] = self.now()

    async def _stream(self, row: int) -> None:
        trace, target = self.trace, self.target
        n_out = int(trace.output_len[row])
        client = trace.client_names[int(trace.client[row])]
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": n_out,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": client,
        }
        if target.force_output_len:
            body.update(min_tokens=n_out, ignore_eos=True)
        headers = {"X-Client-Id": client, "X-Request-Id": str(trace.request_id[row])}
        # the body goes as is, in extra_body (which replaces the SDK's typed fields): the SDK
        # checks a typed prompt element by element, 30 ms of CPU for a 2,000-token prompt
        # against 1 ms this way (measured create() -> request sent, on fairsim-serve)
        if target.endpoint == "chat":
            text = prompt_text(int(trace.prompt_len[row]), self.count_tokens)
            body["messages"] = [{"role": "user", "content": text}]
            request = self.client.chat.completions.with_streaming_response.create(
                model=self.model, messages=[], extra_body=body, extra_headers=headers
            )
        else:
            body["prompt"] = (
                prompt_token_ids(trace, row, self.seed)
                if target.prompt == "token_ids"
                else prompt_text(int(trace.prompt_len[row]), self.count_tokens)
            )
            request = self.client.completions.with_streaming_response.create(  # type: ignore[assignment]
                model=self.model, prompt="", extra_body=body, extra_headers=headers
            )
        async with request as response:
            self.received.http_status[row] = response.status_code
            kind = response.headers.get("content-type", "")
            if not kind.startswith("text/event-stream"):
                self._fail(row, FAILED, f"not an event stream (content-type {kind or 'none'})")
                return
            await self._read_events(row, response)

    async def _read_events(self, row: int, response: Any) -> None:
        """Server-Sent Events, one JSON chunk per `data:` line (as every OpenAI-compatible
        server sends them), each stamped when its line arrives: parsing the chunks into the
        SDK's objects first delayed the stamps by 2-3 ms per burst of 10 streams."""
        rec, chat = self.received, self.target.endpoint == "chat"
        times = rec.tokens[row]
        previous: float | None = None
        async for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            now = self.now()
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = orjson.loads(payload)
            if chunk.get("error"):
                error = chunk["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                self._fail(row, FAILED, f"error event: {message}")
                return
            if chunk.get("usage"):
                rec.reported_tokens[row] = chunk["usage"].get("completion_tokens", -1)
            choices = chunk.get("choices") or [{}]
            text = (
                (choices[0].get("delta") or {}).get("content") if chat else choices[0].get("text")
            )
            if not text:
                continue
            k = max(1, self.count_tokens(text)) if self.count_tokens else 1
            if not times:
                rec.first_token_at[row] = now
            times.extend(chunk_times(previous, now, k))
            previous = now
        rec.finished_at[row] = self.now()
        if times:
            rec.status[row] = COMPLETED
        else:
            self._fail(row, FAILED, "the stream carried no tokens")

    def _ended(self, row: int) -> None:
        self.ended += 1
        after = self.successor.get(row)
        if after is not None:
            nxt, think = after
            self.tasks.add(task := asyncio.create_task(self._after(nxt, think)))
            task.add_done_callback(self.tasks.discard)
        elif self.ended == len(self.trace):
            self.all_ended.set()

    async def _after(self, row: int, think: float) -> None:
        at = self.now() + think
        await self._sleep_until(at)
        await self._request(row, at)

    def _snapshot(self, done: bool = False) -> ProgressSnapshot:
        rec, t = self.received, self.trace
        completed = rec.status == COMPLETED
        return ProgressSnapshot(
            now=self.now(),
            finished=self.ended,
            total=len(t),
            arrival=rec.sent_at,
            prompt_len=t.prompt_len,
            output_len=t.output_len,
            first_token_at=np.where(completed, rec.first_token_at, np.nan),
            finished_at=np.where(completed, rec.finished_at, np.nan),
            done=done,
        )

    async def _report(self, progress: Callable[[ProgressSnapshot], None]) -> None:
        while True:
            await asyncio.sleep(1.0)
            progress(self._snapshot())


async def preflight(target: TargetConfig) -> str:
    """The model to use; a one-line error when the target cannot be reached or is not an
    OpenAI-compatible API (GET /models)."""
    timeout = openai.Timeout(target.stall_timeout, connect=target.connect_timeout)
    async with openai.AsyncOpenAI(
        base_url=target.url, api_key=target.api_key or "none", max_retries=0, timeout=timeout
    ) as client:
        try:
            models = [m.id async for m in client.models.list()]
        except openai.APIConnectionError as err:
            raise ConfigError(
                f"target.url={target.url!r}: cannot connect ({_first_line(err.__cause__ or err)})"
            ) from None
        except openai.AuthenticationError:
            raise ConfigError(
                f"target.api_key: the server at {target.url} refused it (401)"
            ) from None
        except openai.APIStatusError as err:
            raise ConfigError(
                f"target.url={target.url!r}: not an OpenAI-compatible API "
                f"(GET /models answered {err.status_code})"
            ) from None
        except (openai.APIError, ValueError, TypeError, AttributeError) as err:
            raise ConfigError(
                f"target.url={target.url!r}: not an OpenAI-compatible API "
                f"(GET /models: {_first_line(err)})"
            ) from None
    if target.model is not None:
        return target.model
    if not models:
        raise ConfigError(f"target.model: {target.url} lists no models; set target.model")
    return models[0]


def _error_message(err: openai.APIStatusError) -> str:
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return _first_line(err)


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]
