"""Live sessions (simulator/engines/live.py): requests submitted while the simulation runs give
exactly the timeline of an offline run of the same arrivals (the digital-twin guarantee), the
token times streamed as time advances are the timeline's, and bad use is refused clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate

import conf
from policies import FCFS, RPM, VTC
from simulator.api import compose_config
from simulator.core.errors import ConfigError
from simulator.engines import ClusterConfig, SLoRAConfig, VLLMConfig, simulate
from simulator.engines.live import CapacityError, LiveSession

COST = instantiate(compose_config().cost_model)  # the default: Llama-7B on an A10G
CLIENTS = ("alice", "bob", "carol")


def arrivals(seed: int, n: int) -> list[tuple[float, int, int, int]]:
    """(time, client, prompt, output): bursts of three clients, some sharing an instant."""
    rng = np.random.default_rng(seed)
    times = np.sort(np.round(rng.exponential(0.08, n).cumsum(), 2))
    return [
        (float(t), int(rng.integers(3)), int(rng.integers(8, 400)), int(rng.integers(1, 120)))
        for t in times
    ]


def run_live(
    session: LiveSession, requests, seed: int, form: bool = True
) -> dict[int, list[float]]:
    """Submit each request at its time, advancing in between by random amounts; collect what
    is streamed. `form` False: as the live server does, each advance applies the steps that
    ended and the next are formed once their tokens are out (by `next_event`, or the next
    advance when a request comes first)."""
    rng = np.random.default_rng(seed + 1)
    streamed: dict[int, list[float]] = {}
    for t, client, prompt, output, *more in requests:  # more: interaction fields, if any
        while session.now < t:  # advance in random slices, never past the next arrival
            session.advance(min(t, session.now + float(rng.uniform(0.0, 0.3))), form)
            for e in session.emitted():
                assert all(x < session.now for x in e.times)  # nothing from the future
                streamed.setdefault(e.row, []).extend(e.times)
            if rng.random() < 0.5:
                session.next_event()
        session.submit(client, prompt, output, t, **(more[0] if more else {}))
    horizon = max(session.next_event(), session.now)
    while horizon < np.inf:
        session.advance(horizon + 1e-9)
        for e in session.emitted():
            streamed.setdefault(e.row, []).extend(e.times)
        horizon = session.next_event()
    return streamed


@pytest.mark.parametrize("form", [True, False], ids=["formed_at_once", "formed_after_hand_out"])
@pytest.mark.parametrize("engine", [SLoRAConfig(pool_tokens=6000), VLLMConfig(pool_tokens=6000)])
@pytest.mark.parametrize("policy", [FCFS, VTC])
def test_a_live_run_is_the_offline_run_of_its_arrivals(engine, policy, form):
    requests = arrivals(7, 150)
    session = LiveSession(policy(), COST, engine, clients=CLIENTS, capacity=400)
    streamed = run_live(session, requests, 7, form)
    live = session.close()
    offline = simulate(session.arrivals(), policy(), COST, engine)
    assert live.status.tolist() == offline.status.tolist()
    for a, b in zip(live.token_times(), offline.token_times(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(live.finished_at, offline.finished_at)
    # what was streamed, token by token, is the timeline
    rows, index, times = live.token_times()
    for row in range(len(requests)):
        assert streamed.get(row, []) == times[rows == row].tolist()
    assert (live.status == 0).all() and len(streamed) == len(requests)


def test_preemptions_and_skipped_steps_stream_every_token_once():
    """A small vLLM pool preempts: token runs restart; each token is streamed exactly once."""
    requests = arrivals(3, 120)
    engine = VLLMConfig(pool_tokens=1200, block_size=16)
    session = LiveSession(FCFS(), COST, engine, clients=CLIENTS, capacity=200)
    streamed = run_live(session, requests, 3)
    live = session.close()
    assert int(live.request_columns["preemptions"].sum()) > 0
    rows, index, times = live.token_times()
    for row in range(len(requests)):
        assert streamed.get(row, []) == times[rows == row].tolist()


def test_a_request_no_engine_can_run_is_refused_at_once():
    session = LiveSession(FCFS(), COST, SLoRAConfig(pool_tokens=500), clients=CLIENTS)
    row = session.submit(0, 800, 10, 0.0)
    session.advance(0.001)
    (news,) = session.emitted()
    assert (news.row, news.ended, news.status, news.times) == (row, True, "refused", [])
    assert news.reason == "kv_pool_too_small"


def test_bad_use_is_refused_clearly():
    from policies import DLPM, LPM, Andes
    from policies.fairserve import FairServe

    class Custom(FCFS):
        name = "custom"
        runs_live = False  # a policy declares whether it can run live

    with pytest.raises(ConfigError, match="not supported in live mode"):
        LiveSession(Custom(), COST, SLoRAConfig())
    for policy in (LPM(), DLPM(), Andes()):  # they do not declare it
        with pytest.raises(ConfigError, match=f"policy '{policy.name}' is not supported in live"):
            LiveSession(policy, COST, VLLMConfig(pool_tokens=10_000))
    with pytest.raises(ConfigError, match="live mode needs the expected lengths of every app"):
        LiveSession(FairServe(), COST, SLoRAConfig())
    with pytest.raises(ConfigError, match="horizon"):
        LiveSession(FCFS(), COST, SLoRAConfig(horizon=10.0))
    session = LiveSession(FCFS(), COST, SLoRAConfig(), capacity=1)
    session.submit(0, 10, 10, 0.0)
    with pytest.raises(CapacityError, match="full"):
        session.submit(0, 10, 10, 0.0)
    later = LiveSession(FCFS(), COST, SLoRAConfig())
    later.advance(2.0)
    with pytest.raises(ValueError, match="before the session's time"):
        later.submit(0, 5, 5, 0.5)
    with pytest.raises(ValueError, match="client 3"):
        later.submit(3, 5, 5, 2.0)
    assert later.count == 0  # nothing half-submitted


@pytest.mark.parametrize("engine", [SLoRAConfig(pool_tokens=6000), VLLMConfig(pool_tokens=6000)])
def test_an_aborted_request_stops_and_frees_its_memory_at_the_next_step(engine):
    session = LiveSession(FCFS(), COST, engine, clients=CLIENTS)
    long = session.submit(0, 300, 500, 0.0)
    waiting = [session.submit(1, 2000, 400, 0.0) for _ in range(3)]  # not all fit at once
    session.advance(2.0)
    got = sum(len(e.times) for e in session.emitted() if e.row == long)
    assert 0 < got < 500
    rep = session.runner.replicas[0]
    used = rep.kv_used()
    session.abort(long)
    session.abort(waiting[-1])  # still queued: it just leaves
    session.advance(2.5)
    news = {e.row: e for e in session.emitted()}
    assert news[long].ended and (news[long].status, news[long].reason) == ("rejected", "aborted")
    assert news[waiting[-1]].reason == "aborted" and not news[waiting[-1]].times
    assert len(news[long].times) <= 2  # at most the steps already decided
    timeline = session.close()
    assert timeline.generated[long] == got + len(news[long].times) < 500
    assert rep.kv_used() == 0 and used > 0  # freed (the rest finished normally)
    assert (timeline.status[waiting[:2]] == 0).all()


@pytest.mark.parametrize("engine", [SLoRAConfig(pool_tokens=6000), VLLMConfig(pool_tokens=6000)])
def test_a_step_is_formed_only_once_the_tokens_before_it_are_handed_out(engine):
    """The live server's order (vLLM's: a step's output goes out before the next is
    scheduled): `advance(t, form=False)` applies the steps that ended and forms none, so their
    tokens are out before the next step is formed; the next `next_event()` forms it. An abort
    meanwhile comes after that step: the timeline is the one of forming at once."""
    timelines = []
    for form in (True, False):
        session = LiveSession(FCFS(), COST, engine, clients=CLIENTS)
        rows = [session.submit(0, 300, 200, 0.0), session.submit(1, 800, 300, 0.0)]
        rep = session.runner.replicas[0]
        formed: list[float] = []  # the instants the replica forms a step at

        def schedule(frontier, rep=rep, formed=formed, plain=rep.schedule):
            formed.append(rep.now)
            return plain(frontier)

        rep.schedule = schedule
        session.advance(0.5, form)
        session.next_event()  # (the server asks when to wake)
        session.advance(1.0, form)
        news = session.emitted()
        assert news and all(e.times for e in news)  # the ended steps' tokens
        assert max(t for e in news for t in e.times) <= rep.now < 1.0  # its last step's end
        assert (formed[-1] == rep.now) == form  # the step starting there: formed, or not yet
        due = session.next_event()
        assert formed[-1] == rep.now and due >= 1.0  # formed now, to end later
        session.advance(1.5, form)
        session.abort(rows[0])
        timelines.append(session.close())
    at_once, after = timelines
    assert at_once.reason.tolist() == after.reason.tolist()
    assert at_once.reason[rows[0]] == "aborted"
    for a, b in zip(at_once.token_times(), after.token_times(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_idle_replica_takes_in_an_arrival_before_anything_is_handed_out():
    """Only a step's successor waits for its tokens to go out: an arrival at an idle replica
    is taken in (here, rejected by its rate limit) by `advance(t, form=False)` itself, so the
    server's one `emitted()` after it reports the rejection (a deferred one went unreported,
    and the client waited)."""
    session = LiveSession(RPM(limit=1), COST, VLLMConfig(pool_tokens=6000), clients=CLIENTS)
    first = session.submit(0, 10, 2, 0.0)
    session.advance(1.0, form=False)
    session.form()
    assert [e.row for e in session.emitted() if e.ended] == [first]
    second = session.submit(0, 10, 2, 1.0)  # the same client within the minute
    session.advance(1.5, form=False)
    news = session.emitted()
    assert [(e.row, e.status, e.reason) for e in news] == [(second, "rejected", "rpm_limit")]


@pytest.mark.parametrize("engine", [SLoRAConfig(pool_tokens=6000), VLLMConfig(pool_tokens=6000)])
def test_vtc_with_a_prediction_charges_an_aborted_request_only_the_tokens_it_streamed(engine):
    """VTC(oracle) charges a request's whole output (its max_tokens) when it is admitted; its
    client going away mid-stream gives back what was never streamed: the client's counter
    ends at its prompt plus twice the tokens it got (no lift: one client)."""
    vtc = VTC(prediction="oracle", lift="none")
    session = LiveSession(vtc, COST, engine, clients=CLIENTS)
    row = session.submit(0, 300, 500, 0.0)
    session.advance(2.0)
    session.abort(row)
    timeline = session.close()
    got = int(timeline.generated[row])
    assert timeline.reason[row] == "aborted" and 0 < got < 500
    assert vtc.counter[0] == 300 + 2 * got


@pytest.mark.parametrize("form", [True, False], ids=["formed_at_once", "formed_after_hand_out"])
@pytest.mark.parametrize("dispatcher", ["round_robin", "least_requests"])
def test_a_live_cluster_is_the_offline_run_of_its_arrivals(dispatcher, form):
    """Two replicas: assigned up front (round robin, each runs alone) or coupled (least
    requests, stepping together)."""
    requests = arrivals(11, 150)
    engine, cluster = VLLMConfig(pool_tokens=3000), ClusterConfig(2, dispatcher)
    session = LiveSession(FCFS(), COST, engine, cluster, clients=CLIENTS, capacity=200)
    streamed = run_live(session, requests, 11, form)
    live = session.close()
    offline = simulate(session.arrivals(), FCFS(), COST, engine, cluster)
    for a, b in zip(live.token_times(), offline.token_times(), strict=True):
        np.testing.assert_array_equal(a, b)
    rows, index, times = live.token_times()
    for row in range(len(requests)):
        assert streamed.get(row, []) == times[rows == row].tolist()
    assert set(live.request_columns["replica"].tolist()) == {0, 1}


def test_fairserve_live_throttles_and_charges_as_an_offline_run_of_its_arrivals():
    """FairServe in a live run (expected lengths from app_stats, users in two apps, calls
    naming their interactions): the same throttling, drops and token timeline as offline."""
    from policies.fairserve import FairServe

    rng = np.random.default_rng(5)
    requests, t = [], 0.0
    for key in range(70):  # interactions of 1 to 3 calls by three users
        user = int(rng.integers(3))
        for call in range(int(rng.integers(1, 4))):
            t += float(rng.exponential(0.04))
            more = {"interaction": key, "call_index": call, "system_prompt_len": 30}
            requests.append((round(t, 2), user, int(rng.integers(50, 600)),
                             int(rng.integers(20, 200)), more))  # fmt: skip
    stats = {"input": 300.0, "system": 30.0, "output": 100.0}
    make = lambda: FairServe(app_stats={"chat": stats, "code": stats}, user_limit=4, window=5.0)  # noqa: E731
    engine = SLoRAConfig(pool_tokens=4000)
    session = LiveSession(make(), COST, engine, clients=CLIENTS, capacity=400,
                          client_apps=("chat", "chat", "code"))  # fmt: skip
    streamed = run_live(session, sorted(requests, key=lambda r: r[0]), 5)
    live = session.close()
    offline = simulate(session.arrivals(), make(), COST, engine)
    assert live.status.tolist() == offline.status.tolist()
    assert live.reason.tolist() == offline.reason.tolist()
    for a, b in zip(live.token_times(), offline.token_times(), strict=True):
        np.testing.assert_array_equal(a, b)
    reasons = set(live.reason[live.status == 1].tolist())
    assert {"user_limit", "interaction_throttled"} <= reasons, reasons  # overload throttled
    rows, _, times = live.token_times()
    for row in range(len(requests)):
        assert streamed.get(row, []) == times[rows == row].tolist()


def test_the_policies_that_declare_runs_live_are_the_ones_live_mode_serves():
    """Every built-in policy config, instantiated: the ones that run live declare it."""
    policies = sorted(p.stem for p in (Path(conf.__file__).parent / "policy").glob("*.yaml"))
    live = {
        name
        for name in policies
        if instantiate(compose_config([f"policy={name}"]).policy, _convert_="all").runs_live
    }
    assert live == set(policies) - {"lpm", "dlpm", "andes"}
