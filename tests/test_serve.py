"""`fairsim-serve` against the official `openai` SDK, on loopback, bounded in time: streaming
and plain answers for several tenants at once with exact chunk counts and usage, the 400 / 401 /
403 / 429 paths in OpenAI's error format, Prometheus metrics, and on SIGINT a run folder whose token
timeline is exactly an offline run of the arrivals it recorded (the digital-twin guarantee)."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate

openai = pytest.importorskip("openai")

from conftest import BIN, Server  # noqa: E402
from simulator.api import compose_config  # noqa: E402
from simulator.engines import simulate  # noqa: E402
from traces.schema import Trace  # noqa: E402

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    overrides = getattr(request, "param", ())
    s = Server(tmp_path / "run", "serve.time_scale=20", *overrides)
    try:
        yield s
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(timeout=10)


def client(server: Server, **kw: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60, **kw)


async def stream_chat(api: openai.AsyncOpenAI, user: str, max_tokens: int) -> tuple[int, object]:
    chunks, usage = 0, None
    stream = await api.chat.completions.create(
        model="fairsim",
        messages=[{"role": "user", "content": "tell me a story " * 20}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Client-Id": user},
    )
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        elif chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
    return chunks, usage


def test_tenants_stream_at_once_with_exact_chunks_and_usage_and_the_run_is_its_offline_twin(
    server: Server,
):
    async def scenario() -> list[tuple[int, object]]:
        api = client(server)
        jobs = [stream_chat(api, f"tenant{i % 3}", 5 + 7 * i) for i in range(9)]
        plain = api.completions.create(model="fairsim", prompt=list(range(40)), max_tokens=12)
        results = await asyncio.gather(*jobs, plain)
        completion = results.pop()
        assert completion.usage.prompt_tokens == 40 and completion.usage.completion_tokens == 12
        assert len(completion.choices[0].text.split()) == 12
        models = await api.models.list()
        assert [m.id for m in models.data] == ["fairsim"]
        return results

    results = asyncio.run(scenario())
    for i, (chunks, usage) in enumerate(results):
        assert chunks == 5 + 7 * i
        assert usage.completion_tokens == 5 + 7 * i
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    out = server.stop()
    assert "10 requests" in out
    # the run folder: every request completed, each tenant named, and an offline run of the
    # recorded arrivals (same configuration) gives the same token timeline
    requests = pd.read_parquet(server.folder / "requests.parquet")
    tokens = pd.read_parquet(server.folder / "tokens.parquet")
    assert (requests.status == "completed").all() and len(requests) == 10
    assert set(requests.client.astype(str)) == {"tenant0", "tenant1", "tenant2", "default"}
    names = tuple(pd.unique(requests.client.astype(str)))
    trace = Trace(
        request_id=requests.request_id.to_numpy(),
        client=np.array([names.index(c) for c in requests.client.astype(str)]),
        arrival=requests.arrival.to_numpy(),
        prompt_len=requests.prompt_len.to_numpy(),
        output_len=requests.output_len.to_numpy(),
        client_names=names,
        client_weight=np.ones(len(names)),
    )
    cfg = compose_config(["compare_with=null"], config_name="serve")
    policy, cost, engine = (instantiate(cfg[k], _convert_="all") for k in ("policy", "cost_model",
                                                                         "engine"))  # fmt: skip
    offline = simulate(trace, policy, cost, engine).tokens_frame()
    live = tokens.sort_values(["request_id", "index"]).reset_index(drop=True)
    offline = offline.sort_values(["request_id", "index"]).reset_index(drop=True)
    np.testing.assert_array_equal(live["time"].to_numpy(), offline["time"].to_numpy())
    writes = pd.read_parquet(server.folder / "socket_writes.parquet")
    assert len(writes) == sum(5 + 7 * i for i in range(9))
    assert (writes.lag >= -1e-9).all()  # never written before its simulated time
    # released by the driver at or after its time, written by its stream after its release
    assert (writes.release_lag >= -1e-9).all() and (writes.write_lag >= 0).all()
    np.testing.assert_allclose(writes.lag, writes.release_lag + writes.write_lag, atol=1e-12)
    summary = json.loads((server.folder / "summary.json").read_text())
    lag, scale = summary["socket_lag"], summary["clock"]["time_scale"]
    assert lag["tokens"] == len(writes)  # in wall-clock ms: simulated seconds / time scale
    assert lag["lag_ms"]["p99"] == pytest.approx(1000 * np.percentile(writes.lag, 99) / scale)
    assert lag["gc_pauses"]["count"] >= 0 and lag["gc_pauses"]["total_ms"] >= 0


@pytest.mark.parametrize("server", [("policy=rpm", "policy.limit=1")], indirect=True)
def test_errors_come_in_openais_format(server: Server):
    async def scenario() -> None:
        api = client(server)
        with pytest.raises(openai.BadRequestError, match="n must be 1"):
            await api.completions.create(model="fairsim", prompt="hi", max_tokens=2, n=2)
        with pytest.raises(openai.BadRequestError, match="logprobs"):
            await api.completions.create(model="fairsim", prompt="hi", max_tokens=2, logprobs=2)
        with pytest.raises(openai.BadRequestError, match="min_tokens"):
            await api.completions.create(
                model="fairsim", prompt="hi", max_tokens=2, extra_body={"min_tokens": 5}
            )
        await api.completions.create(model="fairsim", prompt="hi", max_tokens=2, user="bob")
        with pytest.raises(openai.RateLimitError, match="rejected by the scheduling policy"):
            await api.completions.create(model="fairsim", prompt="hi", max_tokens=2, user="bob")

    asyncio.run(scenario())
    server.stop()


@pytest.mark.parametrize("server", [("serve.api_keys={k1: alice, k2: bob}",)], indirect=True)
def test_with_api_keys_the_key_decides_the_client_and_no_header_skips_it(server: Server):
    """Once keys are set, X-Client-Id (or `user`) never stands in for a key: a wrong or missing
    key gets 401 with or without the header, a header naming another client than the key's gets
    403, and a header restating the key's own client is served."""

    def api(key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=60)

    async def create(key: str, **headers: str) -> None:
        await api(key).completions.create(
            model="fairsim", prompt="x", max_tokens=1, extra_headers=headers, user="mallory"
        )

    async def scenario() -> None:
        with pytest.raises(openai.AuthenticationError):
            await create("none")
        with pytest.raises(openai.AuthenticationError):  # the header was the bypass
            await create("none", **{"X-Client-Id": "alice"})
        with pytest.raises(openai.AuthenticationError):
            await create("k1x", **{"X-Client-Id": "alice"})
        with pytest.raises(openai.PermissionDeniedError, match="does not match"):
            await create("k2", **{"X-Client-Id": "alice"})
        with pytest.raises(openai.AuthenticationError):
            await api("none").models.list()
        assert [m.id for m in (await api("k1").models.list()).data] == ["fairsim"]
        await create("k1")
        await create("k2", **{"X-Client-Id": "bob"})

    asyncio.run(scenario())
    raw = urllib.request.Request(  # no Authorization header at all, only the claimed client
        server.url + "/completions",
        data=json.dumps({"model": "fairsim", "prompt": "x", "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json", "X-Client-Id": "alice"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(raw, timeout=30)
    assert refused.value.code == 401
    server.stop()
    requests = pd.read_parquet(server.folder / "requests.parquet")
    assert requests.client.astype(str).tolist() == ["alice", "bob"]


def test_metrics_use_vllms_names(server: Server):

    async def one() -> None:
        await client(server).completions.create(model="fairsim", prompt="x" * 80, max_tokens=4)

    asyncio.run(one())
    text = urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics").read().decode()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket"):  # fmt: skip
        assert name in text, name
    assert re.search(r'vllm:prompt_tokens_total\{model_name="fairsim"\} 20\.0', text)
    assert re.search(r'vllm:generation_tokens_total\{model_name="fairsim"\} 4\.0', text)
    server.stop()


async def flood(url: str, user: str, concurrency: int, seconds: float) -> float:
    """`concurrency` streams of back-to-back requests for `seconds`; the service the client
    received, priced as VTC prices it (prompt tokens + 2 x output tokens)."""
    api = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    service = [0.0]

    async def one_stream() -> None:
        while True:
            stream = await api.completions.create(
                model="fairsim", prompt=list(range(64)), max_tokens=400, stream=True, user=user
            )
            got = 0
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    got += 1
                    service[0] += 2.0 + (64.0 if got == 1 else 0.0)

    tasks = [asyncio.create_task(one_stream()) for _ in range(concurrency)]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return service[0]


@pytest.mark.parametrize("policy", ["vtc", "fcfs"])
def test_two_flooding_clients_get_vtc_fair_service_and_fcfs_favours_the_heavy_one(
    tmp_path: Path, policy: str
):
    """Heavy keeps 24 streams open, light 8, on a 2,600-token pool that runs 5 such requests
    (64 + 400 tokens) at once: both are always backlogged (each wants more than half, even
    while some of its streams are between requests), for 120 simulated seconds. Theorem 4.4
    bounds VTC's difference by 2U, U = max(w_p L_in, w_q M) = 5,200; FCFS serves requests in
    arrival order, so heavy gets about 3x light."""
    # at 10x real speed (12 s of wall time): at 20x a client process that shared a busy CPU
    # could not send light's next requests in time, so light was not always backlogged
    s = Server(tmp_path / policy, "serve.time_scale=10", f"policy={policy}",
               "engine.pool_tokens=2600")  # fmt: skip

    async def both() -> tuple[float, float]:
        heavy, light = await asyncio.gather(flood(s.url, "heavy", 24, 12.0),
                                            flood(s.url, "light", 8, 12.0))  # fmt: skip
        return heavy, light

    try:
        heavy, light = asyncio.run(both())
    finally:
        s.stop()
    bound = 2 * max(64, 2 * 2600)
    assert light > 0 and heavy + light > 4 * bound  # enough service to tell them apart
    if policy == "vtc":
        assert abs(heavy - light) <= bound
    else:
        assert heavy > 2 * light and heavy - light > bound


def test_a_client_that_disconnects_aborts_its_request(server: Server):
    async def leave_early() -> int:
        api = client(server)
        stream = await api.completions.create(
            model="fairsim", prompt="x" * 400, max_tokens=2000, stream=True
        )
        got = 0
        async for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].text)
            if got == 3:
                break
        await stream.close()
        await asyncio.sleep(0.5)  # 10 simulated seconds: the engine would be far along
        return got

    assert asyncio.run(leave_early()) == 3
    console = server.stop()
    assert "Traceback" not in console and "Error" not in console, console  # not a server fault
    requests = pd.read_parquet(server.folder / "requests.parquet")
    (row,) = requests.itertuples()
    assert (row.status, row.reason) == ("rejected", "aborted")
    tokens = pd.read_parquet(server.folder / "tokens.parquet")
    assert 3 <= len(tokens) < 100  # stopped within a few steps of the disconnect, not 2,000


@pytest.mark.parametrize("server", [("serve.max_waiting=1", "engine.pool_tokens=600")],
                         indirect=True)  # fmt: skip
def test_a_full_waiting_queue_answers_429_with_retry_after(server: Server):
    """One 100 + 480-token request (8 simulated seconds) fits the 600-token pool at a time: the
    second waits, the third finds the queue (max 1) full."""

    async def three() -> list[object]:
        api = client(server)
        calls = [
            api.completions.create(model="fairsim", prompt=list(range(100)), max_tokens=480)
            for _ in range(3)
        ]
        first = asyncio.ensure_future(calls[0])
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(calls[1])
        await asyncio.sleep(0.05)
        results = await asyncio.gather(first, second, calls[2], return_exceptions=True)
        return list(results)

    results = asyncio.run(three())
    refused = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert len(refused) == 1 and "waiting queue is full" in str(refused[0])
    assert refused[0].response.headers["retry-after"] == "1"
    assert sum(not isinstance(r, Exception) for r in results) == 2
    server.stop()


@pytest.mark.parametrize("server", [("serve.tokenizer=builtins:len",)], indirect=True)
def test_a_plugged_in_tokenizer_counts_the_prompt(server: Server):
    """serve.tokenizer names a function from text to its token count (here len: one token per
    character); without it a prompt of text counts ceil(characters / 4)."""

    async def one() -> int:
        answer = await client(server).completions.create(
            model="fairsim", prompt="hello world", max_tokens=1
        )
        return answer.usage.prompt_tokens

    assert asyncio.run(one()) == len("hello world")
    server.stop()


def test_a_tokenizer_that_cannot_be_found_is_a_one_line_error(tmp_path: Path):
    res = subprocess.run(
        [str(BIN / "fairsim-serve"), "serve.tokenizer=no_such_module:count",
         f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    assert "serve.tokenizer='no_such_module:count'" in res.stderr
    assert "accepted: 'module:function'" in res.stderr


FAIRSERVE = (
    "policy=fairserve",
    "policy.throttle=always",  # FS(W+L): the limits are checked at every arrival
    "policy.user_limit=2",
    "policy.app_stats={chat: {input: 50, system: 10, output: 20},"
    " default: {input: 50, system: 0, output: 20}}",
    "serve.apps={chat: [alice]}",
)


@pytest.mark.parametrize("server", [FAIRSERVE], indirect=True)
def test_fairserve_throttles_live_calls_by_user_and_interaction(server: Server):
    """Calls name their interaction in headers; alice's third first call within the window
    breaks the user limit (429), a later call of that interaction is dropped (429), and a later
    call of an admitted interaction is served."""

    async def call(interaction: str, index: int) -> str:
        headers = {"X-Interaction-Id": interaction, "X-Call-Index": str(index),
                   "X-System-Prompt-Tokens": "10", "X-Client-Id": "alice"}  # fmt: skip
        try:
            await client(server).completions.create(
                model="fairsim", prompt=list(range(40)), max_tokens=3, extra_headers=headers
            )
        except openai.RateLimitError as err:
            return str(err)
        return "served"

    async def scenario() -> list[str]:
        return [await call(key, i) for key, i in (("a", 0), ("b", 0), ("c", 0), ("c", 1), ("a", 1))]

    outcomes = asyncio.run(scenario())
    assert outcomes[:2] == ["served", "served"] and outcomes[4] == "served"
    assert "user_limit" in outcomes[2] and "interaction_throttled" in outcomes[3]
    server.stop()
    requests = pd.read_parquet(server.folder / "requests.parquet")
    assert requests.reason.fillna("").tolist() == [
        "",
        "",
        "user_limit",
        "interaction_throttled",
        "",
    ]
    assert requests.app.astype(str).unique().tolist() == ["chat"]
    assert requests.call_index.tolist() == [0, 0, 0, 1, 1]
    assert requests.system_prompt_len.tolist() == [10] * 5


def refusal(tmp_path: Path, *overrides: str) -> str:
    """`fairsim-serve` with these overrides exits 2 (an input error) printing one line, no
    traceback: that line."""
    res = subprocess.run(
        [str(BIN / "fairsim-serve"), *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr
    return lines[0]


def test_a_port_already_in_use_is_an_input_error_naming_serve_port(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refusal(tmp_path, f"serve.port={port}")
    assert f"serve.port={port}: cannot listen on 127.0.0.1:{port}" in line
    assert "serve.port=0" in line


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("workload=vtc_artifact", "serves the requests its clients send"),
        ("client_timeout=5", "clients give up on their own"),
        ("workload.rate_scale=2", "serves the requests its clients send"),
        ("replications=3", "a live session runs once"),
    ],
)
def test_a_key_the_live_server_never_reads_is_refused_not_ignored(tmp_path, override, says):
    line = refusal(tmp_path, "serve.port=0", override)
    assert line.startswith(f"fairsim-serve: error: {override.split('=')[0]}: ") and says in line
    assert not (tmp_path / "run").exists(), "an input error leaves no run folder"


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_streams_are_framed_as_vllm_frames_them_lf_only(server: Server, path: str):
    """vLLM's OpenAI server ends each event with a bare blank line (`\\n\\n`); clients such as
    inference-perf split on exactly that, and measured nothing from CRLF-framed streams."""
    body = {"model": "fairsim", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    if path == "/completions":
        body["prompt"] = "x" * 40
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    request = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request) as response:
        assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        raw = response.read()
    server.stop()
    assert b"\r" not in raw
    assert raw.endswith(b"data: [DONE]\n\n")
    events = raw.split(b"\n\n")[:-1]
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in events)
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    texts = [c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content")
             for c in chunks if c["choices"]]  # fmt: skip
    assert sum(bool(t) for t in texts) == 5
    assert chunks[-1]["usage"]["completion_tokens"] == 5


SLO = "slos=[{name: ttfc, metric: ttfc, percentile: 0.5, value: 60}]"


@pytest.mark.parametrize("server", [(SLO,)], indirect=True)
def test_the_servers_run_folder_is_scored_as_an_offline_runs_is(server: Server):
    """QoE, SLO results and the Veeksha files under metrics/, so a client's report has
    something server-side to be held against."""

    async def four() -> None:
        api = client(server)
        await asyncio.gather(*(stream_chat(api, f"c{i}", 8) for i in range(4)))

    asyncio.run(four())
    server.stop()
    summary = json.loads((server.folder / "summary.json").read_text())
    assert summary["qoe"]["fluidity"]["requests"] == 4
    (slo,) = summary["slo_results"]["results"]
    assert slo["name"] == "ttfc" and summary["slo_results"]["all_slos_met"]
    metrics = server.folder / "metrics"
    for name in ("request_level_metrics.jsonl.gz", "summary_stats.json", "slo_results.json",
                 "ttfc.csv", "tbc.csv", "throughput_metrics.json"):  # fmt: skip
        assert (metrics / name).stat().st_size > 0, name
    rows = gzip.decompress((metrics / "request_level_metrics.jsonl.gz").read_bytes()).splitlines()
    assert len(rows) == 4


def test_warmup_rows_are_the_first_requests_and_those_soon_after_the_first():
    from simulator.apps.live.serve import warmup_rows

    arrival = np.array([3.0, 1.0, np.nan, 1.5, 9.0])  # row 2 never sent
    assert warmup_rows(arrival, 0, 0.0).tolist() == [False] * 5
    assert warmup_rows(arrival, 2, 0.0).tolist() == [False, True, False, True, False]
    assert warmup_rows(arrival, 1, 2.5).tolist() == [True, True, False, True, False]
    assert not warmup_rows(np.array([np.nan]), 3, 1.0).any()


@pytest.mark.parametrize(
    "server", [("serve.warmup_requests=2", "serve.exclude_warmup=true")], indirect=True
)
def test_warmup_requests_are_kept_apart_from_the_scored_run(server: Server):
    """A client's two warm-up requests land in warmup_requests.parquet (and their tokens in
    warmup_tokens.parquet), marked; the summary and metrics/ score the other three."""

    async def five() -> None:
        api = client(server)
        for i in range(5):  # one after another: the first two to arrive are the warm-up
            await stream_chat(api, "alice", 4 + i)

    asyncio.run(five())
    server.stop()
    folder = server.folder
    aside = pd.read_parquet(folder / "warmup_requests.parquet")
    kept = pd.read_parquet(folder / "requests.parquet")
    assert aside.warmup.all() and not kept.warmup.any()
    assert sorted(aside.output_len) == [4, 5] and sorted(kept.output_len) == [6, 7, 8]
    assert len(pd.read_parquet(folder / "warmup_tokens.parquet")) == 4 + 5
    assert len(pd.read_parquet(folder / "tokens.parquet")) == 6 + 7 + 8
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["requests"] == 3 and summary["output_tokens"] == 21
    rows = gzip.decompress((folder / "metrics" / "request_level_metrics.jsonl.gz").read_bytes())
    assert len(rows.splitlines()) == 3
