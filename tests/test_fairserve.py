"""FairServe (policies/fairserve.py), its RPM baseline, the multi-app generator, the agentic
sessions loader and the interaction metrics, against the FairServe paper's rules."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import a10g_cost, installed_data
from policies import FairServe, RPMInteraction
from simulator.core.queue import WaitingQueue
from simulator.core.seam import ADMIT
from simulator.engines import SLoRAConfig, simulate
from simulator.metrics import interactions
from traces import AbusiveUsers, AppSpec, Empirical, Fixed, LogNormal, MultiAppWorkload, Trace
from traces.agentic import load_agentic_sessions

RULES = {"user_limit", "app_limit"}


def workload(seed: int, users: int = 12, abuse: float = 3.0, mode: str = "open_loop"):
    apps = [
        AppSpec("chat", users, 0.02, LogNormal(200, 0.8, 1200), LogNormal(100, 0.6, 400), 100),
        AppSpec(
            "agent",
            users // 2,
            0.01,
            LogNormal(400, 0.7, 1500),
            LogNormal(60, 0.5, 200),
            300,
            calls=Empirical((2, 3, 6), (5, 3, 2)),
        ),
    ]
    abusers = [AbusiveUsers("chat", 1, abuse, 10, 40)] if abuse else []
    return MultiAppWorkload(apps, 60, abusive=abusers, mode=mode).build(seed)


def run(trace, policy, pool=6000, **engine):
    return simulate(trace, policy, a10g_cost(), SLoRAConfig(pool_tokens=pool, **engine))


random_workloads = st.builds(
    workload,
    seed=st.integers(0, 10_000),
    users=st.integers(4, 16),
    abuse=st.sampled_from([0.0, 2.0, 6.0]),
    mode=st.sampled_from(["open_loop", "chained"]),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_workloads, st.sampled_from([3000, 6000]))
def test_fairserve_throttles_only_first_calls_and_wastes_nothing(tr, pool):
    r = run(tr, FairServe(user_limit=3), pool).requests_frame()
    reason = r["reason"].astype(str)
    throttled = r[reason.isin(RULES)]
    assert (throttled["call_index"] == 0).all()  # mid-interaction calls are never throttled
    assert interactions.throttling(r)["wasted_tokens"] == 0
    # a throttled interaction's later calls never run
    cut = r[r["interaction_id"].isin(throttled["interaction_id"])]
    assert cut["admitted_at"].isna().all()
    assert set(reason[cut.index]) <= RULES | {"interaction_throttled", "not_arrived", "queued"}
    # every call is accounted for
    status = r["status"].astype(str)
    assert set(status) <= {"completed", "rejected", "in_flight", "refused"}
    assert set(reason[status == "rejected"]) <= RULES | {"interaction_throttled"}
    done = r[status == "completed"]
    assert (done["tokens_emitted"] == done["output_len"]).all()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_workloads)
def test_no_throttling_while_everything_fits(tr):
    """With a pool no batch can fill, the fit test never fails, so OIT never throttles."""
    pool = int((tr.prompt_len + tr.output_len).sum()) + 10
    tl = run(tr, FairServe(user_limit=1, app_limit=1), pool, batch_max_tokens=10**9)
    assert (tl.requests_frame()["status"].astype(str) == "completed").all()


def test_rpm_baseline_aborts_the_rest_and_wastes_tokens():
    tr = workload(3, users=10, abuse=4.0)
    r = run(tr, RPMInteraction(limit=3)).requests_frame()
    reason = r["reason"].astype(str)
    first_reject = r[reason == "rpm_limit"].groupby("interaction_id")["call_index"].min()
    for inter, k in first_reject.items():
        later = r[(r["interaction_id"] == inter) & (r["call_index"] > k)]
        assert (later["reason"].astype(str) == "interaction_aborted").all()
    t = interactions.throttling(r)
    assert t["throttled_interactions"] == first_reject.shape[0] > 0
    assert t["wasted_tokens"] > 0  # calls served before their interaction was cut short


def test_wsc_normalises_by_the_apps_expected_work():
    """Two users of different apps, each sending exactly its app's expected call, end with equal
    counters in every charge form (paper: 1 each)."""
    tr = Trace.from_columns(
        client=["a_user", "b_user"],
        app=["short", "long"],
        arrival=[0.0, 0.0],
        prompt_len=[60, 1300],
        output_len=[40, 7],
        optional={"system_prompt_len": [20, 300], "interaction_id": [0, 1], "call_index": [0, 0]},
    )
    for charge in ("paper", "completion", "incremental"):
        policy = FairServe(charge=charge, throttle="none")
        run(tr, policy)
        assert policy.counter[0] == pytest.approx(policy.counter[1], rel=1e-12), charge
    paper = FairServe(throttle="none")
    run(tr, paper)
    np.testing.assert_allclose(paper.counter, [1.0, 1.0])
    favoured = FairServe(throttle="none", priority={"a_user": 0.5})
    run(tr, favoured)
    np.testing.assert_allclose(favoured.counter, [0.5, 1.0])


def test_interaction_preference_picks_the_least_served_user_mid_interaction():
    tr = Trace.from_columns(
        client=["u1", "u2", "u1", "u2", "u3"],
        arrival=[0.0, 0.0, 1.0, 1.0, 1.0],
        prompt_len=[10, 10, 10, 10, 10],
        output_len=[5, 5, 5, 5, 5],
        optional={"interaction_id": [0, 1, 0, 1, 2], "call_index": [0, 0, 1, 1, 0]},
    )
    policy = FairServe(throttle="none")
    policy.bind(tr)
    queue = WaitingQueue(tr.client.tolist())
    for req in (0, 1):
        policy.on_arrival(req, 0.0, queue)
        queue.push(req)
    for req in (0, 1):
        assert policy.admit(req, 0.0, fits=True) is ADMIT
        queue.remove(req)  # both interactions started; u1 was charged as much as u2
    for req in (2, 3, 4):
        policy.on_arrival(req, 1.0, queue)
        queue.push(req)
    policy.counter[:] = [50.0, 30.0, 0.0]  # u3, least served overall, has no interaction going
    assert policy.pick(queue, 1.0) == 3  # u2: least served among u1, u2
    assert policy.admit(3, 1.0, fits=True) is ADMIT
    queue.remove(3)
    assert policy.pick(queue, 1.0) == 2
    assert policy.admit(2, 1.0, fits=True) is ADMIT
    queue.remove(2)
    assert policy.pick(queue, 1.0) == 4  # no call of a started interaction waits: global


def test_fast_forward_keeps_fairserve_bit_identical():
    tr = workload(5, users=12, abuse=3.0)
    fast, slow = FairServe(user_limit=3), FairServe(user_limit=3)
    a = run(tr, fast).requests_frame()
    b = run(tr, slow, fast_forward=False).requests_frame()
    assert a.equals(b)
    assert fast.counter_events().equals(slow.counter_events())


def test_variants_are_named_as_in_the_paper():
    assert FairServe().name == "fairserve"
    assert FairServe(throttle="none", interaction_preference=False).name == "fs_w"
    kw = dict(first_call_only=False, drop_rest=False, interaction_preference=False)
    assert FairServe(throttle="always", **kw).name == "fs_wl"  # type: ignore[arg-type]
    assert FairServe(throttle="overload", **kw).name == "fs_wo"  # type: ignore[arg-type]


def test_bad_policy_settings_are_named():
    with pytest.raises(ValueError, match="policy.charge"):
        FairServe(charge="sometimes")
    with pytest.raises(ValueError, match="policy.user_limit"):
        FairServe(user_limit=0)
    tr = workload(1, users=4, abuse=0.0)
    with pytest.raises(ValueError, match="unknown app 'mail'"):
        FairServe(app_stats={"mail": {"input": 1, "system": 0, "output": 1}}).bind(tr)


def test_generator_is_seeded_and_abusers_do_not_move_benign_users():
    a, b = workload(7, abuse=0.0), workload(7, abuse=0.0)
    assert np.array_equal(a.arrival, b.arrival) and np.array_equal(a.prompt_len, b.prompt_len)
    with_abuse = workload(7, abuse=5.0)
    benign = ~np.char.find(np.array(with_abuse.client_names)[with_abuse.client], "abuser") >= 0
    assert np.array_equal(np.sort(with_abuse.arrival[benign]), np.sort(a.arrival))
    assert len(with_abuse) > len(a)
    # system prompts are part of the prompt; interactions are numbered by first arrival
    assert (a.prompt_len > a.system_prompt_len).all()
    firsts = a.call_index == 0
    assert np.all(np.diff(a.arrival[firsts][np.argsort(a.interaction_id[firsts])]) >= 0)


def test_chained_calls_follow_their_predecessor():
    tr = workload(2, users=6, abuse=0.0, mode="chained")
    r = run(tr, FairServe(throttle="none"), pool=50_000).requests_frame()
    later = r[r["call_index"] > 0]
    for _, row in later.iterrows():
        prev = r[
            (r["interaction_id"] == row["interaction_id"])
            & (r["call_index"] == row["call_index"] - 1)
        ]
        assert row["arrival"] == pytest.approx(prev["finished_at"].iloc[0] + 1.0)


def test_generator_rejects_bad_input():
    app = AppSpec("chat", 2, 0.1, Fixed(10), Fixed(10))
    with pytest.raises(ValueError, match="unknown app"):
        MultiAppWorkload([app], 10, abusive=[AbusiveUsers("mail", 1, 1.0)])
    with pytest.raises(ValueError, match="workload.mode"):
        MultiAppWorkload([app], 10, mode="sometimes")
    with pytest.raises(ValueError, match="user_rate"):
        replace(app, user_rate=0.0)


def test_summary_and_metrics_report_interactions(tmp_path):
    from simulator.report.run_folder import write_run

    tr = workload(4, users=10, abuse=4.0)
    out = write_run(run(tr, RPMInteraction(limit=3)), tmp_path)
    s = out.summary
    assert s["throttled_requests"] == int((out.requests["status"] == "rejected").sum())
    assert s["wasted_tokens"] > 0
    assert {"app", "user", "interaction_id", "call_index", "num_calls"} <= set(out.requests)
    apps = {row["app"] for row in s["interactions"]["per_app"]}
    assert apps == {"chat", "agent"}
    ux = s["interactions"]
    assert 0 < ux["served_user_share"] <= 1 and ux["service_provided"] <= ux["interactions_ended"]


def test_agentic_sessions_become_chained_interactions():
    path = installed_data("data:agentic/claude_code_sessions_flat.csv")
    tr = load_agentic_sessions(path, sessions=20)
    import pandas as pd

    raw = pd.read_csv(path)
    raw = raw[raw["trace_id"].isin(pd.unique(raw["trace_id"])[:20])]
    assert len(tr) == len(raw) and tr.num_clients == 20 and tr.chained
    assert set(tr.app_names) <= {"main", *raw["subagent_type"].dropna().unique()}
    # a new interaction starts after each end_turn and at each agent's first call
    turns = raw.groupby(["trace_id", "agent_id"])["stop"].apply(
        lambda s: 1 + int((s.iloc[:-1] == "end_turn").sum())
    )
    assert int(tr.interaction_id.max()) + 1 == int(turns.sum())
    with pytest.raises(ValueError, match="session_rate"):
        load_agentic_sessions(path, session_rate=0)


@pytest.mark.slow
def test_experiments_reproduce_the_papers_claims():
    """fairsim-fairserve-table's experiments. fairserve_overload (artifact-shaped, one heavy
    user): FairServe throttles at least 10x fewer interactions than RPM with the same user limit
    and wastes nothing while RPM wastes prompt tokens. fairserve_sustained (two abusers flood a
    small workload for 60 s): benign users' interactions finish sooner than under VTC, still with
    no waste. fairserve_no_overload: FairServe throttles nothing while RPM still does."""
    from simulator.apps.papers.fairserve_table import measure

    fs, rpm = (measure("fairserve_overload", p) for p in ("fairserve", "rpm_interaction"))
    assert fs["wasted_tokens"] == 0 < rpm["wasted_tokens"]
    assert 0 < 10 * fs["throttled_interactions"] <= rpm["throttled_interactions"]
    flood, flood_vtc = (measure("fairserve_sustained", p) for p in ("fairserve", "vtc"))
    assert flood["wasted_tokens"] == 0 < flood["throttled_interactions"]
    assert flood["benign_interaction_s"] < flood_vtc["benign_interaction_s"]
    calm, calm_rpm = (measure("fairserve_no_overload", p) for p in ("fairserve", "rpm_interaction"))
    assert calm["throttled_requests"] == 0 < calm_rpm["throttled_requests"]
    assert calm_rpm["wasted_tokens"] > 0


def test_artifact_shaped_workload_matches_the_trace_facts():
    """experiment=fairserve_overload's trace against the artifact's trace facts: ~10,000 calls
    from 1,358 configured users (about a tenth send nothing) in 23 apps over 71 s, the heaviest
    user ~2,100 calls (1,778 of them in 60 s in the artifact), the median user a few calls per
    minute, prompt + output < 2,000 (1/8 scale), one app of 288-call interactions, most of one
    call."""
    from simulator.api import build_trace, compose_config

    tr = build_trace(compose_config(["experiment=fairserve_overload"]))
    assert 9_000 <= len(tr) <= 11_000
    assert 1_150 <= tr.num_clients <= 1_359 and len(tr.app_names) == 23
    firsts = tr.call_index == 0
    assert tr.arrival[firsts].max() < 71
    assert int((tr.prompt_len + tr.output_len).max()) < 2_000
    calls = np.bincount(tr.client, minlength=tr.num_clients)
    heavy = tr.client_names.index("chat/abuser0.0")
    assert 1_900 <= calls[heavy] <= 2_300 and calls[heavy] == calls.max()
    in_60s = np.sum((tr.client == heavy) & (tr.arrival < 60))
    assert 1_600 <= in_60s <= 2_000
    assert 3 <= np.median(np.delete(calls, heavy)) * 60 / 71 <= 6
    assert set(tr.num_calls[firsts].tolist()) >= {1, 2, 3, 4, 288}
    assert np.mean(tr.num_calls[firsts] == 1) > 0.5


def test_the_fairserve_table_prints_the_papers_figures_beside_the_measured(capsys):
    from simulator.apps.papers.fairserve_table import main

    main(["--experiment", "fairserve_overload", "--policy", "rpm_interaction"])
    head, row = capsys.readouterr().out.splitlines()[:2]
    assert head.split()[:6] == ["experiment", "policy", "thr", "calls", "paper", "thr"]
    cells = row.split()
    # measured calls, the paper's 2,843, measured interactions, the paper's 1,996, ... 108k
    assert cells[3] == "2843" and cells[5] == "1996" and cells[7] == "108000"
