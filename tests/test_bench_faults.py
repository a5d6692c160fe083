"""`fairsim-bench` against targets that misbehave, on loopback: every request ends with a clear
record (tokens received so far kept), the run never hangs, and an unreachable or non-OpenAI
target is a one-line error (exit 2)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from aiohttp import web

pytest.importorskip("openai")

from test_bench import run  # noqa: E402

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients

# what the fake target does with request k (X-Request-Id), and the record fairsim-bench keeps
BEHAVIOUR = {
    0: ("http 500", "failed", 0, "http 500: boom"),
    1: ("3 tokens, then silence", "failed", 3, "stalled: nothing received for 1 s"),
    2: ("a JSON body instead of an event stream", "failed", 0, "not an event stream"),
    3: ("2 tokens, then the connection drops", "failed", 2, "connection dropped"),
    4: ("4 tokens, as it should", "completed", 4, None),
    5: ("http 429", "rejected", 0, "http 429: slow down"),
}


def chunk(text: str) -> str:
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": None}]})


async def completions(request: web.Request) -> web.StreamResponse:
    k = int(request.headers["X-Request-Id"])
    if k == 0:
        return web.json_response({"error": {"message": "boom"}}, status=500)
    if k == 5:
        return web.json_response({"error": {"message": "slow down"}}, status=429)
    if k == 2:
        return web.json_response({"choices": [{"text": "not streamed"}]})
    # CRLF framing, which the SSE standard allows and some servers write: the client reads it
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range({1: 3, 3: 2, 4: 4}[k]):
        await response.write(f"data: {chunk(f' t{i}')}\r\n\r\n".encode())
    if k == 1:
        await asyncio.sleep(3600)  # stalls until the client gives up
    if k == 3:
        assert request.transport is not None
        request.transport.close()  # drops the connection mid-stream
        return response
    await response.write(b"data: [DONE]\r\n\r\n")
    return response


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})


def serve_in_thread(routes: list[web.RouteDef]) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


@pytest.fixture
def faulty_target() -> Iterator[str]:
    yield from serve_in_thread(
        [web.get("/v1/models", models), web.post("/v1/completions", completions)]
    )


def six_requests(tmp_path: Path) -> list[str]:
    trace = tmp_path / "six.csv"
    rows = "\n".join(f"{k},{0.05 * k},8,4" for k in BEHAVIOUR)
    trace.write_text("request_id,arrival,prompt_len,output_len\n" + rows + "\n")
    return ["workload=table", f"workload.path={trace}"]


def test_each_kind_of_failure_gets_a_clear_record_and_nothing_received_is_lost(
    faulty_target: str, tmp_path: Path
):
    folder = tmp_path / "run"
    res = bench_against(faulty_target, tmp_path, "target.stall_timeout=1")
    # 4 of 6 failed: the folder is written, the command says so and exits 4
    assert res.returncode == 4, res.stderr
    warning, verdict = res.stderr.strip().splitlines()[-2:]
    assert warning.startswith("fairsim-bench: 4 of 6 requests failed (") and "stalled" in warning
    assert "67% of requests failed, more than target.max_failed_share=0.1" in verdict
    assert json.loads((folder / "job.json").read_text())["status"] == "completed"
    requests = pd.read_parquet(folder / "requests.parquet").set_index("request_id")
    tokens = pd.read_parquet(folder / "tokens.parquet")
    received = tokens.groupby("request_id").size().reindex(requests.index, fill_value=0)
    for k, (what, status, count, reason) in BEHAVIOUR.items():
        row = requests.loc[k]
        assert row.status == status, (what, row.status, row.reason)
        assert received[k] == count == row.tokens_emitted, what
        if reason is None:
            assert pd.isna(row.reason), what
        else:
            assert reason in row.reason, (what, row.reason)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status_counts"] == {
        "completed": 1, "rejected": 1, "refused": 0, "in_flight": 0, "failed": 4
    }  # fmt: skip


def bench_against(url: str, tmp_path: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    """fairsim-bench sending `six_requests` to `url`, its run folder `tmp_path / "run"`."""
    folder = f"hydra.run.dir={tmp_path / 'run'}"
    return run(
        "fairsim-bench", f"target.url={url}", *six_requests(tmp_path), *settings,
        "progress=false", folder, check=False,
    )  # fmt: skip


def test_an_unreachable_target_is_a_one_line_error(tmp_path: Path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = bench_against(f"http://127.0.0.1:{port}/v1", tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().count("\n") == 0
    assert "cannot connect" in res.stderr and f"127.0.0.1:{port}" in res.stderr


def test_a_server_that_is_not_an_openai_api_is_a_one_line_error(tmp_path: Path):
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html>hello</html>", content_type="text/html")

    for url in serve_in_thread([web.get("/{tail:.*}", page)]):
        res = bench_against(url, tmp_path)
    assert res.returncode == 2, res.stderr
    assert "not an OpenAI-compatible API" in res.stderr, res.stderr


def test_a_bad_target_setting_names_the_key(tmp_path: Path):
    folder = f"hydra.run.dir={tmp_path / 'run'}"
    res = run("fairsim-bench", "target.endpoint=embeddings", folder, check=False)
    assert res.returncode == 2
    assert "target.endpoint='embeddings'" in res.stderr and "completions, chat" in res.stderr
    res = run("fairsim-bench", "+target.concurrency=3", folder, check=False)
    assert res.returncode == 2
    assert "target.concurrency" in res.stderr and "max_concurrency" in res.stderr


@pytest.mark.parametrize("override", ["policy=fcfs", "cluster.replicas=2", "compare_with=fcfs"])
def test_a_simulation_setting_is_refused_not_ignored(tmp_path: Path, override: str):
    """The target schedules as it does: a policy, cluster or comparison given to the bench
    would be ignored silently, so it is refused, saying why, before anything is sent."""
    res = run("fairsim-bench", override, f"hydra.run.dir={tmp_path / 'run'}", check=False)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"fairsim-bench: error: {override.split('=')[0]}: "
    )


def test_a_tolerated_share_of_failures_warns_and_exits_0(faulty_target: str, tmp_path: Path):
    res = bench_against(
        faulty_target, tmp_path, "target.stall_timeout=1", "target.max_failed_share=0.7"
    )
    assert res.returncode == 0, res.stderr
    assert "fairsim-bench: 4 of 6 requests failed" in res.stderr.strip().splitlines()[-1]


def test_a_client_that_gives_up_abandons_its_request_as_in_a_simulation(
    faulty_target: str, tmp_path: Path
):
    """`client_timeout` (or inference-perf's `load.request_timeout`): the bench's client gives
    up on a request that long after sending it, as a simulated client does: the request that
    stalls after 3 tokens ends `rejected`, reason `client_timeout`, its 3 tokens kept, long
    before the stall timeout (60 s); the others end as before."""
    folder = tmp_path / "run"
    res = bench_against(faulty_target, tmp_path, "client_timeout=1")
    # 3 of 6 failed (500, not a stream, dropped) and 1 was given up on: both counted
    assert res.returncode == 4, res.stderr
    warning, verdict = res.stderr.strip().splitlines()[-2:]
    assert "3 of 6 requests failed" in warning and "clients gave up on 1 of 6" in warning
    assert "67% of requests failed" in verdict
    requests = pd.read_parquet(folder / "requests.parquet").set_index("request_id")
    stalled = requests.loc[1]
    assert (stalled.status, stalled.reason, stalled.tokens_emitted) == (
        "rejected", "client_timeout", 3
    )  # fmt: skip
    assert stalled.finished_at - stalled.arrival < 5.0
    assert requests.loc[4].status == "completed" and requests.loc[0].status == "failed"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["client_timeouts"]["requests"] == 1
