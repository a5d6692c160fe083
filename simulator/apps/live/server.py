"""The OpenAI-compatible HTTP side of `fairsim-serve`: every token is sent when the simulated
engine produces it.

`LiveEngine` couples a `LiveSession` to the wall clock: simulated time is (wall time since
start) x `time_scale`. A request is submitted at the simulated instant it arrives; a driver task
advances the simulation to the present whenever a step is due or a request arrives, and hands
each request's new tokens to its handler, which writes them at once (and records when, so the
lag between a token's simulated time and its write is measurable). HTTP comes from aiohttp;
Server-Sent Events are framed exactly as vLLM's OpenAI server frames them (`data: ...` and a
blank line, LF only, no pings), since some benchmark clients split events on `\n\n` alone; the
metrics are in `live_metrics.py`.

Lengths: a prompt given as token ids counts them; text counts ceil(characters /
`chars_per_token`) (4 by default, a common estimate for English), or what a tokenizer plugged in
with `serve.tokenizer` says, plus 4 per chat message. The
output is `max_tokens` tokens (as with `ignore_eos`), at least `min_tokens`: deterministic filler
words, one token per chunk, with exact usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from simulator.apps.live.metrics import ServerMetrics
from simulator.engines.live import CapacityError, LiveSession

FILLER = (  # the output text: one word per token, cycling
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "simulated",
    "engines", "stream", "tokens",
)  # fmt: skip
# each filler word as a JSON string: the first token's, and any later one's (a space before)
WORDS = tuple((json.dumps(w), json.dumps(" " + w)) for w in FILLER)
PLACEHOLDER = "\u0000"  # stands for the text in a chunk template
UNSUPPORTED = {  # OpenAI parameters fairsim does not model: a 400 names them
    "logprobs": "logprobs",
    "top_logprobs": "logprobs",
    "echo": "echo",
    "suffix": "suffix",
    "tools": "tool calls",
    "tool_choice": "tool calls",
    "functions": "function calls",
    "function_call": "function calls",
    "response_format": "structured output",
}


class RequestError(Exception):
    """An answer other than 200, in OpenAI's error format."""

    def __init__(
        self, status: int, message: str, kind: str, param: str | None = None, **headers: str
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.param, self.headers = status, kind, param, headers

    def response(self) -> web.Response:
        body = {
            "error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}
        }
        return web.json_response(body, status=self.status, headers=self.headers)


@dataclass(frozen=True)
class CallInfo:
    """Where a request sits in a multi-call interaction (FairServe), from its headers:
    X-Interaction-Id, X-Call-Index, X-System-Prompt-Tokens."""

    interaction: str | None = None  # None: the request is an interaction of its own
    call_index: int = 0
    system_prompt_tokens: int = 0

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> CallInfo:
        numbers = {}
        for header, name in (
            ("X-Call-Index", "call_index"),
            ("X-System-Prompt-Tokens", "system_prompt_tokens"),
        ):
            text = headers.get(header, "0")
            if not text.isdigit():
                raise RequestError(
                    400, f"{header} must be an integer >= 0, got {text!r}", "invalid_request_error"
                )
            numbers[name] = int(text)
        return cls(headers.get("X-Interaction-Id"), **numbers)


@dataclass
class Stream:
    """One request's tokens on their way to its client."""

    row: int
    client: str
    prompt_tokens: int
    max_tokens: int
    events: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    sim_times: list[float] = field(default_factory=list)
    written_at: list[float] = field(default_factory=list)  # simulated-clock time of each write
    released_at: list[float] = field(default_factory=list)  # ... when the driver handed it out
    outcome: str = "in_flight"
    client_request_id: str | None = None  # the X-Request-Id header, if the client sent one


# The event loop's timers wake up to a whole millisecond late (epoll's timeout is in ms), noise
# on every token's write time; the driver sleeps until 1 ms before a step is due and yields the
# loop until then. benchmarks/serve_load.py --streams 20: lag p50 1.41-1.46 -> 1.01-1.02 ms; at 200
# streams the loop is never idle and the lag is the same within noise (p99 14.6 / 17.9 ms).
TIMER_RESOLUTION = 1e-3


class SimClock:
    """Simulated time = seconds of wall time since start x time_scale."""

    def __init__(self, time_scale: float) -> None:
        self.scale, self.start = time_scale, time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self.start) * self.scale

    def seconds_until(self, t: float) -> float:
        return (t - self.now()) / self.scale


class LiveEngine:
    """A LiveSession driven by the wall clock, shared by every handler of one server."""

    def __init__(
        self,
        session: LiveSession,
        time_scale: float,
        clients: dict[str, int],
        free_slots: list[int],
    ) -> None:
        self.session, self.clock = session, SimClock(time_scale)
        self.clients, self.free_slots = clients, free_slots  # client name -> slot of the session
        self.streams: dict[int, Stream] = {}
        self.interactions: dict[str, int] = {}  # X-Interaction-Id -> the session's key
        self.finished: list[Stream] = []
        self.wake = asyncio.Event()
        self.stopped = False
        self.gc_pauses: list[float] = []  # seconds each garbage collection held the loop
        self._gc_started = 0.0

    def slot(self, client: str) -> int:
        if client not in self.clients:
            if not self.free_slots:
                raise RequestError(
                    429,
                    f"too many distinct clients (serve.max_clients); {client!r} has none",
                    "rate_limit_error",
                    **{"Retry-After": "1"},
                )
            self.clients[client] = self.free_slots.pop(0)
        return self.clients[client]

    def waiting(self) -> int:
        return sum(len(q) for q in {id(q): q for q in self.session.runner.queues}.values())

    def submit(
        self, client: str, prompt_tokens: int, max_tokens: int, call: CallInfo | None = None
    ) -> Stream:
        session = self.session
        now = max(self.clock.now(), session.now)
        call = call or CallInfo()
        interaction = None
        if call.interaction is not None:  # the client's key, as a number of this session
            interaction = self.interactions.setdefault(call.interaction, len(self.interactions))
        try:
            row = session.submit(
                self.slot(client),
                prompt_tokens,
                max_tokens,
                now,
                interaction,
                call.call_index,
                min(call.system_prompt_tokens, prompt_tokens),
            )
        except CapacityError as err:
            raise RequestError(503, str(err), "server_error") from err
        stream = Stream(row, client, prompt_tokens, max_tokens)
        self.streams[row] = stream
        self.wake.set()
        return stream

    def abort(self, stream: Stream) -> None:
        """The client of `stream` went away: its request leaves the simulated engine (its
        memory is freed at the next step)."""
        if stream.row in self.streams:
            self.session.abort(stream.row)
            self.wake.set()

    async def drive(self) -> None:
        """Advance the simulation to the present whenever a step ends or a request arrives,
        and hand out the tokens produced."""
        session = self.session
        gc.callbacks.append(self._time_gc)
        try:
            while not self.stopped:
                self.wake.clear()  # (a request that comes from here on wakes the next wait)
                now = self.clock.now()
                if now > session.now:
                    session.advance(now, form=False)  # the steps that ended, not the next
                while True:
                    handed = self.clock.now()  # the tokens' release: the write lag starts here
                    handed_out = session.emitted()
                    for news in handed_out:
                        stream = self.streams[news.row]
                        for t in news.times:
                            stream.events.put_nowait(("token", t, handed))
                        if news.ended:
                            stream.events.put_nowait(("end", news.status, news.reason))
                            del self.streams[news.row]
                    if handed_out:  # the handlers write them before the next step is formed
                        await asyncio.sleep(0)
                    if not session.form():  # (forming late may end more steps: hand them out)
                        break
                due = session.next_event()
                timeout = None if due == math.inf else self.clock.seconds_until(due)
                if timeout is not None and timeout < TIMER_RESOLUTION:
                    await asyncio.sleep(0)  # the last millisecond: yield, don't sleep (see above)
                    continue
                with contextlib.suppress(TimeoutError):  # a step is due
                    await asyncio.wait_for(
                        self.wake.wait(), None if timeout is None else timeout - TIMER_RESOLUTION
                    )
        finally:
            gc.callbacks.remove(self._time_gc)

    def _time_gc(self, phase: str, info: dict[str, int]) -> None:
        """gc's callback: each collection's pause, which delays every token due meanwhile."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_pauses.append(time.perf_counter() - self._gc_started)


# ---- the HTTP handlers -------------------------------------------------------------------


@dataclass
class ServerSettings:
    model: str
    max_waiting: int
    api_keys: dict[str, str]
    count_tokens: Callable[[str], int]  # text -> its prompt tokens
    default_max_tokens: int


def _client(request: web.Request, body: dict[str, Any], key_client: str | None) -> str:
    """The tenant a request is served and charged as: the API key's client when `serve.api_keys`
    is set (see `_authenticate`), else `X-Client-Id`, else the `user` field, else `default`."""
    if key_client is not None:
        return key_client
    header = request.headers.get("X-Client-Id")
    if header:
        return header
    user = body.get("user")
    return str(user) if user else "default"


def _authenticate(request: web.Request, settings: ServerSettings) -> str | None:
    """With `serve.api_keys` set, the key decides the tenant: a missing or unknown key gets 401
    whatever other headers say, and an `X-Client-Id` naming another client than the key's gets
    403 (a header may restate the key's client, never replace it). None without keys."""
    if not settings.api_keys:
        return None
    client = _key_client(request.headers.get("Authorization", ""), settings.api_keys)
    header = request.headers.get("X-Client-Id")
    if header and header != client:
        raise RequestError(
            403, f"X-Client-Id {header!r} does not match this API key's client", "permission_error"
        )
    return client


def _key_client(authorization: str, api_keys: dict[str, str]) -> str:
    """The client of a `Bearer <key>` header; 401 for anything else. Every key is compared in
    constant time, so the answer's timing says nothing about how much of a key was right."""
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    client = None
    if scheme.lower() == "bearer" and key:
        for known, owner in api_keys.items():
            if hmac.compare_digest(known.encode(), key.encode()):
                client = owner
    if client is None:
        raise RequestError(401, "missing or unknown API key", "invalid_request_error")
    return client


def estimate_tokens(chars_per_token: float) -> Callable[[str], int]:
    """The tokenizer-free estimate: ceil(characters / chars_per_token)."""
    return lambda text: math.ceil(len(text) / chars_per_token)


def _prompt_tokens(body: dict[str, Any], chat: bool, text_tokens: Callable[[str], int]) -> int:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(
                400, "messages must be a non-empty list", "invalid_request_error", "messages"
            )
        total = 0
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):  # content parts: their text
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            total += 4 + text_tokens(str(content or ""))
        return total
    ids = body.get("prompt_token_ids")
    prompt = body.get("prompt", ids)
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return max(1, text_tokens(prompt))
    raise RequestError(
        400,
        "prompt must be a string or a list of token ids (one prompt)",
        "invalid_request_error",
        "prompt",
    )


def _max_tokens(body: dict[str, Any], chat: bool, default: int) -> int:
    value = body.get("max_completion_tokens") if chat else None
    if value is None:
        value = body.get("max_tokens", default if chat else 16)
    minimum = body.get("min_tokens", 0) or 0
    for name, v in (("max_tokens", value), ("min_tokens", minimum)):
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "max_tokens" else 0):
            raise RequestError(
                400, f"{name} must be a positive integer", "invalid_request_error", name
            )
    if minimum > value:
        raise RequestError(
            400, "min_tokens must be <= max_tokens", "invalid_request_error", "min_tokens"
        )
    return int(value)


def _check_supported(body: dict[str, Any]) -> None:
    for key, what in UNSUPPORTED.items():
        if body.get(key) not in (None, False, [], 0) or (key == "logprobs" and body.get(key)):
            raise RequestError(
                400,
                f"{key}: {what} are not supported by fairsim-serve",
                "invalid_request_error",
                key,
            )
    for key in ("n", "best_of"):
        if body.get(key, 1) != 1:
            raise RequestError(
                400,
                f"{key} must be 1 (fairsim-serve returns one choice)",
                "invalid_request_error",
                key,
            )


def _chunk(
    kind: str,
    rid: str,
    model: str,
    created: int,
    text: str | None,
    finish: str | None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    if kind == "chat":
        delta = {} if text is None else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    out = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [] if usage is not None else [choice],
    }
    if usage is not None:
        out["usage"] = usage
    return out


async def _first_event(stream: Stream) -> tuple[Any, ...]:
    first = await stream.events.get()
    if first[0] == "end" and first[1] != "completed":
        stream.outcome = first[1]
        if first[1] == "rejected":
            raise RequestError(
                429,
                f"rejected by the scheduling policy: {first[2]}",
                "rate_limit_error",
                **{"Retry-After": "1"},
            )
        raise RequestError(
            400, f"the engine can never serve this request: {first[2]}", "invalid_request_error"
        )
    return first


def make_app(
    engine: LiveEngine,
    settings: ServerSettings,
    registry: CollectorRegistry,
    metrics: ServerMetrics,
) -> web.Application:
    async def generate(request: web.Request, kind: str) -> web.StreamResponse:
        try:
            key_client = _authenticate(request, settings)  # before anything else is looked at
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise RequestError(400, "the body is not JSON", "invalid_request_error") from None
            if not isinstance(body, dict):
                raise RequestError(400, "the body must be a JSON object", "invalid_request_error")
            _check_supported(body)
            chat = kind == "chat"
            client = _client(request, body, key_client)
            prompt = _prompt_tokens(body, chat, settings.count_tokens)
            max_tokens = _max_tokens(body, chat, settings.default_max_tokens)
            if engine.waiting() >= settings.max_waiting:
                raise RequestError(
                    429,
                    "the waiting queue is full (serve.max_waiting)",
                    "rate_limit_error",
                    **{"Retry-After": "1"},
                )
            stream = engine.submit(client, prompt, max_tokens, CallInfo.of(request.headers))
            stream.client_request_id = request.headers.get("X-Request-Id")
            first = await _first_event(stream)
        except RequestError as err:
            return err.response()
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{stream.client_request_id or stream.row}"
        created, model = int(time.time()), settings.model
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": max_tokens,
            "total_tokens": prompt + max_tokens,
        }
        try:
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await _stream(
                    request,
                    engine,
                    stream,
                    first,
                    kind,
                    rid,
                    model,
                    created,
                    usage if include_usage else None,
                )
            texts: list[str] = []
            event = first
            while event[0] == "token":
                texts.append(FILLER[len(texts) % len(FILLER)])
                stream.sim_times.append(event[1])
                event = await stream.events.get()
            stream.outcome = "completed"
            text = " ".join(texts)
            if chat:
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
            else:
                choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
            obj = "chat.completion" if chat else "text_completion"
            return web.json_response(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        finally:
            if stream.outcome not in ("completed", "rejected", "refused"):
                engine.abort(stream)  # the client went away: the engine drops the request
            metrics.record(stream.row, stream.prompt_tokens, stream.sim_times)
            engine.finished.append(stream)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, "text")

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, "chat")

    async def models(request: web.Request) -> web.Response:
        try:
            _authenticate(request, settings)  # /v1 needs a key once keys are set, as in vLLM
        except RequestError as err:
            return err.response()
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": settings.model, "object": "model", "created": 0, "owned_by": "fairsim"}
                ],
            }
        )

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def prometheus(request: web.Request) -> web.Response:
        metrics.refresh(engine.waiting(), engine.clients)
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.add_routes(
        [
            web.post("/v1/completions", completions),
            web.post("/v1/chat/completions", chat_completions),
            web.get("/v1/models", models),
            web.get("/health", health),
            web.get("/metrics", prometheus),
        ]
    )
    return app


async def _stream(
    request: web.Request,
    engine: LiveEngine,
    stream: Stream,
    first: tuple[Any, ...],
    kind: str,
    rid: str,
    model: str,
    created: int,
    usage: dict[str, int] | None,
) -> web.StreamResponse:
    """Server-Sent Events: one chunk per token as its simulated time comes, then [DONE]."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    if kind == "chat":  # the role first, as OpenAI does
        role = _chunk(kind, rid, model, created, None, None)
        role["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        await _send_event(response, json.dumps(role))
    # each chunk differs only in its text (and the last in its finish reason): two JSON
    # templates filled per token keep a 200-stream server's writes cheap (benchmarks/serve_load.py)
    going, ending = (
        json.dumps(_chunk(kind, rid, model, created, PLACEHOLDER, finish)).split(
            json.dumps(PLACEHOLDER)
        )
        for finish in (None, "length")
    )
    event, k = first, 0
    try:
        while event[0] == "token":
            head, tail = ending if k + 1 == stream.max_tokens else going
            await _send_event(response, head + WORDS[k % len(WORDS)][k > 0] + tail)
            stream.sim_times.append(event[1])
            stream.written_at.append(engine.clock.now())
            stream.released_at.append(event[2])
            k += 1
            event = await stream.events.get()
        if usage is not None:
            await _send_event(
                response, json.dumps(_chunk(kind, rid, model, created, None, None, usage))
            )
        await _send_event(response, "[DONE]")
        stream.outcome = "completed"
    except ConnectionResetError:  # the client went away: its request is aborted, not an error
        stream.outcome = "disconnected"
    except asyncio.CancelledError:
        stream.outcome = "disconnected"
        raise
    return response


async def _send_event(response: web.StreamResponse, data: str) -> None:
    """One event as vLLM writes it: `data: <data>` then a blank line, LF only."""
    await response.write(b"data: " + data.encode() + b"\n\n")
