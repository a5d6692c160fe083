"""What `fairsim` prints: per-client tables capped at a readable size with a switch for all
rows, columns aligned for long client names, SLO verdicts, and a progress line that ends at 100%
with the summary's throughput."""

from __future__ import annotations

import numpy as np

from conftest import a10g_cost, random_trace
from policies import FCFS
from simulator.engines import SLoRAConfig, simulate
from simulator.metrics import latency
from simulator.report.console import format_fairness, format_slos, format_summary
from simulator.report.progress import progress_line
from simulator.report.run_folder import summarize
from traces import Trace


def summary_of(trace):
    timeline = simulate(trace, FCFS(), a10g_cost(), SLoRAConfig())
    r, t, s = timeline.requests_frame(), timeline.tokens_frame(), timeline.steps_frame()
    return summarize(timeline, r, t, s, {"policy": {"_target_": "policies.FCFS"}})


def test_tables_show_the_busiest_clients_up_to_the_cap_and_say_how_many_more():
    summary = summary_of(random_trace(2, 400, 40, 200, 50, 20.0))
    clients = [c for c in summary["latency"] if c != "all"]
    assert len(clients) == 40
    capped = format_summary(summary, max_rows=5).splitlines()
    rows = [line.split()[0] for line in capped if line.split() and line.split()[0] in clients]
    busiest = sorted(clients, key=lambda c: -summary["latency"][c]["requests"])[:5]
    assert sorted(rows) == sorted(busiest)
    assert any(line.startswith("... 35 more clients") for line in capped)
    everything = format_summary(summary, max_rows=None)
    assert "more clients" not in everything
    assert sum(line.split()[0] in clients for line in everything.splitlines() if line) == 40
    fairness = format_fairness(summary, max_rows=5)
    assert sum(line.startswith("service ") for line in fairness.splitlines()) == 5
    assert "... 35 more clients" in fairness


def test_clients_are_listed_in_natural_order_in_every_table():
    summary = summary_of(random_trace(4, 300, 12, 200, 50, 20.0))
    clients = [c for c in summary["latency"] if c != "all"]
    natural = [f"c{k}" for k in range(12)]  # the trace names them in a shuffled order
    assert sorted(clients) == sorted(natural)
    rows = [line.split()[0] for line in format_summary(summary).splitlines() if line.strip()]
    assert [r for r in rows if r in clients] == natural
    fairness = format_fairness(summary).splitlines()
    assert [line.split()[1] for line in fairness if line.startswith("service ")] == natural


def test_long_client_names_keep_the_columns_aligned():
    n = 60
    trace = Trace.from_columns(
        client=["a" * 30 if i % 2 else "b" for i in range(n)],
        arrival=np.arange(n) * 0.2,
        prompt_len=np.full(n, 100),
        output_len=np.full(n, 20),
    )
    table = format_summary(summary_of(trace)).splitlines()
    head = table[1]
    rows = [line for line in table[3:] if line.startswith(("a" * 30, "b ", "all"))]
    assert len(rows) == 3 and {len(line) for line in rows} == {len(head)}
    assert table[0] == "per client (times in seconds)"


def test_slo_results_are_printed_with_pass_or_fail():
    results = {
        "all_slos_met": False,
        "results": [
            {"name": "p99 ttfc", "met": True, "observed_value": 0.5, "threshold": 2.0,
             "lower_is_better": True},
            {"name": "p10 fluidity", "met": False, "observed_value": 0.7, "threshold": 0.9,
             "lower_is_better": False},
        ],
    }  # fmt: skip
    lines = format_slos(results).splitlines()
    assert lines[1].split()[0] == "PASS" and "needs <= 2" in lines[1]
    assert lines[2].split()[0] == "FAIL" and "needs >= 0.9" in lines[2]
    assert lines[-1].strip() == "some SLOs missed"


def test_the_last_progress_line_is_at_100_percent_with_the_summary_throughput():
    trace = random_trace(4, 100, 3, 200, 50, 5.0)
    snapshots: list[str] = []
    timeline = simulate(
        trace,
        FCFS(),
        a10g_cost(),
        SLoRAConfig(horizon=10.0),
        progress=lambda snap: snapshots.append(progress_line(snap)),
    )
    assert snapshots, "the run reports at least once: at its end"
    last = snapshots[-1]
    requests = timeline.requests_frame()
    completed = int((requests.status == "completed").sum())
    assert completed < len(requests), "the horizon leaves requests in flight"
    assert "100%" in last and f"Completed: {completed}/{len(requests)}" in last
    rate = latency.token_throughput(requests)
    assert f"Throughput: {rate:.0f} tok/s" in last and last.endswith("(run ended)")


def test_the_requests_line_says_why_requests_did_not_complete():
    import dataclasses

    from simulator.engines import VLLMConfig

    trace = random_trace(3, 200, 2, 300, 200, 40.0)
    timeout = np.resize(np.array([0.2, np.inf]), len(trace))
    timeline = simulate(
        dataclasses.replace(trace, client_timeout=timeout),
        FCFS(),
        a10g_cost(),
        VLLMConfig(pool_tokens=2000),
    )
    r, t, s = timeline.requests_frame(), timeline.tokens_frame(), timeline.steps_frame()
    summary = summarize(timeline, r, t, s, {})
    line = next(x for x in format_summary(summary).splitlines() if x.startswith("requests:"))
    gave_up = int((r.reason == "client_timeout").sum())
    assert gave_up > 0
    assert line.endswith(f"(why not completed: {gave_up} rejected:client_timeout)")
    gone = r[r.reason == "client_timeout"]
    block = summary["client_timeouts"]
    assert block == {
        "requests": gave_up,
        "before_first_token": int((gone.tokens_emitted == 0).sum()),
        "after_first_token": int((gone.tokens_emitted > 0).sum()),
        "output_tokens_wasted": int(gone.tokens_emitted.sum()),
    }
    assert block["before_first_token"] > 0 and block["after_first_token"] > 0  # both kinds here
    assert (
        f"clients gave up on {gave_up} requests ({block['before_first_token']} before their "
        f"first token, {block['after_first_token']} after it); "
        f"{block['output_tokens_wasted']} output tokens were generated for them in vain"
    ) in format_summary(summary)
    done = summary_of(random_trace(2, 20, 2, 50, 20, 1.0))
    assert "why not completed" not in format_summary(done) and "client_timeouts" not in done
