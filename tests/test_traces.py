import numpy as np
import pytest

from traces import (
    ClientSpec,
    Diurnal,
    Empirical,
    Fixed,
    Gamma,
    LinearRamp,
    OnOff,
    Phase,
    Piecewise,
    Poisson,
    SyntheticWorkload,
    Trace,
    TraceError,
    Uniform,
    UniformInt,
)


def columns(**over):
    base = dict(
        client=["a", "b", "a"], arrival=[0.0, 1.0, 2.0], prompt_len=[5, 6, 7], output_len=[1, 2, 3]
    )
    base.update(over)
    return base


def test_valid_trace_keeps_columns_and_client_codes():
    t = Trace.from_columns(**columns(), client_weights={"b": 2.0})
    assert len(t) == 3 and t.client_names == ("a", "b")
    assert t.client.tolist() == [0, 1, 0]
    assert t.client_weight.tolist() == [1.0, 2.0]
    assert t.request_id.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("field", "value", "row", "accepted"),
    [
        ("prompt_len", [5, -1, 7], 1, "integer >= 1"),
        ("output_len", [1, 2, 0], 2, "integer >= 1"),
        ("prompt_len", [5, 2.5, 7], 1, "integer >= 1"),
        ("output_len", [1, "x", 3], 1, "integer >= 1"),
        ("output_len", ["1", "inf", "3"], 1, "integer >= 1"),  # overflowed int() before
        ("prompt_len", [5, 1e30, 7], 1, "integer >= 1"),  # no int64 holds it
        ("arrival", [0.0, float("nan"), 2.0], 1, "finite number >= 0"),
        ("arrival", [0.0, -1.0, 2.0], 1, "finite number >= 0"),
        ("arrival", [0.0, 3.0, 2.0], 2, "non-decreasing"),
        ("client", ["a", "", "b"], 1, "non-empty label"),
    ],
)
def test_validation_names_row_field_and_what_is_accepted(field, value, row, accepted):
    with pytest.raises(TraceError) as err:
        Trace.from_columns(**columns(**{field: value}), source="t.csv")
    msg = str(err.value)
    assert msg.startswith("t.csv: ") and f"row {row}" in msg and f"'{field}'" in msg
    assert accepted in msg


def test_integral_text_cells_read_as_integers():
    # a JSONL file may quote its numbers: "12.0" is twelve tokens (astype failed on it before)
    t = Trace.from_columns(**columns(prompt_len=["5", "12.0", "7"]))
    assert t.prompt_len.tolist() == [5, 12, 7]


def test_duplicate_ids_length_mismatch_and_empty_are_errors():
    with pytest.raises(TraceError, match="row 2, field 'request_id'.*unique"):
        Trace.from_columns(**columns(), request_id=[4, 5, 4])
    with pytest.raises(TraceError, match="'prompt_len'.*2 rows"):
        Trace.from_columns(**columns(prompt_len=[1, 2]))
    with pytest.raises(TraceError, match="no requests"):
        Trace.from_columns(client=[], arrival=[], prompt_len=[], output_len=[])


def test_unsorted_can_be_sorted_on_request_with_id_tie_break():
    t = Trace.from_columns(**columns(arrival=[2.0, 1.0, 1.0]), request_id=[9, 8, 7], sort=True)
    assert t.arrival.tolist() == [1.0, 1.0, 2.0]
    assert t.request_id.tolist() == [7, 8, 9]
    assert t.prompt_len.tolist() == [7, 6, 5]


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_uniform_is_evenly_spaced_with_phase_and_int_count():
    t = Uniform(1.5).times(360, _rng())
    assert t.shape[0] == 540
    assert np.allclose(np.diff(t), 1 / 1.5)
    assert 0 <= t[0] < 1 / 1.5


def test_poisson_rate_and_exponential_gaps():
    t = Poisson(50.0).times(2000, _rng(1))
    assert abs(t.shape[0] / 2000 - 50) < 1.0  # sd of the count / T is 0.16
    gaps = np.diff(t)
    assert abs(gaps.std() / gaps.mean() - 1) < 0.02  # CV of exponential gaps is 1
    assert t.max() < 2000


def test_gamma_has_requested_cv():
    gaps = np.diff(Gamma(10.0, 3.0).times(20000, _rng(2)))
    assert abs(gaps.mean() - 0.1) < 0.01
    assert abs(gaps.std() / gaps.mean() - 3.0) < 0.15


def test_on_off_keeps_only_on_periods_and_scaling_keeps_periods():
    proc = OnOff(Uniform(2.0), on=60, off=60)
    t = proc.times(600, _rng())
    assert ((t // 60) % 2 == 0).all()
    assert t.shape[0] == 600  # 1200 arrivals, half in ON periods
    t2 = proc.scaled(2.0).times(600, _rng())
    assert t2.shape[0] == 1200 and ((t2 // 60) % 2 == 0).all()


def test_linear_ramp_deterministic_matches_the_artifact_count():
    t = LinearRamp(0.2, 2.0).times(600, _rng())
    assert t[0] == 0.0
    gaps = np.diff(t)
    assert gaps[0] == pytest.approx(1 / 0.2) and gaps[-1] == pytest.approx(1 / 2.0, rel=0.02)
    assert abs(t.shape[0] - 0.5 * (0.2 + 2.0) * 600) <= 5


def test_linear_ramp_poisson_follows_the_intensity():
    t = LinearRamp(1.0, 9.0, poisson=True).times(1000, _rng(3))
    first, second = (t < 500).sum(), (t >= 500).sum()
    # expected counts: integral of the rate over each half = 1500 and 3500
    assert abs(first - 1500) < 150 and abs(second - 3500) < 250


def test_diurnal_arrivals_follow_the_day():
    day = Diurnal(rate=10.0, period=1000.0, amplitude=0.8, peak_at=500.0)
    t = day.times(2000.0, _rng(5))
    # expected per quarter of a day: the integral of 10 (1 + 0.8 cos(2 pi (t - 500) / 1000))
    # = 2500 -+ 8000 / (2 pi) = 1226.8 (night quarters) or 3773.2 (day quarters)
    counts = np.histogram(t, bins=8, range=(0, 2000))[0]
    expected = np.tile([1226.8, 3773.2, 3773.2, 1226.8], 2)
    assert (np.abs(counts - expected) < 4 * np.sqrt(expected)).all()
    grid = np.linspace(0, 300, 300_001)
    assert day.mean_rate(300.0) == pytest.approx(day.rate_at(grid).mean(), rel=1e-4)
    assert day.mean_rate(1000.0) == pytest.approx(10.0)
    assert day.scaled(2.0).mean_rate(1000.0) == pytest.approx(20.0)
    with pytest.raises(TraceError, match="amplitude must be within"):
        Diurnal(rate=1.0, amplitude=1.5)


def test_piecewise_offsets_phases():
    proc = Piecewise([Phase(100, Uniform(1.0)), Phase(100, None), Phase(100, Uniform(2.0))])
    t = proc.times(300, _rng())
    assert ((t < 100) | (t >= 200)).all()
    assert (t < 100).sum() == 100 and (t >= 200).sum() == 200


def test_length_distributions():
    assert (Fixed(7).sample(5, _rng()) == 7).all()
    u = UniformInt(256, 257).sample(100, _rng())
    assert (u == 256).all()  # half-open like the artifact's randint
    e = Empirical([10, 20], [0.0, 1.0]).sample(50, _rng())
    assert (e == 20).all()
    with pytest.raises(ValueError, match="low < high"):
        UniformInt(5, 5)


def workload(**kw):
    return SyntheticWorkload(
        [
            ClientSpec("a", Poisson(1.0), UniformInt(1, 100), UniformInt(1, 100)),
            ClientSpec("b", Uniform(0.5), Fixed(10), Fixed(10), weight=2.0),
        ],
        duration=kw.pop("duration", 300),
        **kw,
    )


def test_same_seed_same_trace_different_seed_different_arrivals():
    a, b, c = workload().build(1), workload().build(1), workload().build(2)
    for col in ("arrival", "client", "prompt_len", "output_len"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
    assert not np.array_equal(a.arrival[:10], c.arrival[:10])
    assert a.client_weight.tolist() == [1.0, 2.0]


def test_streams_are_independent_per_client():
    w1 = workload()
    w2 = SyntheticWorkload([w1.clients[0]], duration=300)
    a, b = w1.build(5), w2.build(5)
    assert np.array_equal(a.arrival[a.client == 0], b.arrival)


def test_rate_scale_doubles_requests():
    assert len(workload(rate_scale=2.0).build(0)) == pytest.approx(
        2 * len(workload().build(0)), rel=0.1
    )
    with pytest.raises(ValueError, match="rate_scale"):
        workload(rate_scale=0)
