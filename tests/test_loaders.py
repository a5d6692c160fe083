"""Trace-file loaders on small files written here and, where ../shared/data exists, on the real
files (row counts and statistics of the published files); validation errors name the file,
row and field; fuzzed broken files only ever raise TraceError."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import shared_file
from cost_models import LinearStepCost
from policies.fcfs import FCFS
from simulator.api import unfit
from simulator.apps.data.trace_stats import main
from simulator.engines import SLoRAConfig, simulate
from traces import (
    LengthsWorkload,
    Poisson,
    ServeGenPool,
    TraceWorkload,
    load_azure,
    load_mooncake,
    load_table,
    load_vidur,
    load_vtc_real,
)
from traces.loaders import load_lengths
from traces.schema import TraceError
from traces.servegen import load_servegen_pool
from traces.stats import detect_format, trace_stats


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
    return p


# ---- each loader on a small file --------------------------------------------------------------
def test_azure_timestamps_with_seven_fractional_digits_are_exact(tmp_path):
    p = write(
        tmp_path,
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319601,3180,8\n"
        "2023-11-16 18:18:03.9799600,100,1\n",
    )
    t = load_azure(p)
    assert t.arrival.tolist() == [0.0, 0.0520001, 60.0]
    assert t.prompt_len.tolist() == [4808, 3180, 100] and t.output_len.tolist() == [10, 8, 1]
    assert t.client_names == ("azure",)


def test_vidur_and_vtc_real_formats(tmp_path):
    v = write(
        tmp_path,
        "v.csv",
        "arrived_at,num_prefill_tokens,num_decode_tokens\n1.5,10,3\n2.0,20,4\n",
    )
    t = load_vidur(v)
    assert t.arrival.tolist() == [0.0, 0.5] and t.prompt_len.tolist() == [10, 20]
    r = write(
        tmp_path,
        "r.csv",
        "req_id,arrival_s,client,prompt_len,output_len\n5,0.0,x,1,2\n7,0.5,y,3,4\n",
    )
    t = load_vtc_real(r)
    assert t.request_id.tolist() == [5, 7] and t.client_names == ("x", "y")


def test_mooncake_jsonl_in_milliseconds_keeps_hash_ids(tmp_path):
    lines = [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 0, "input_length": 512, "output_length": 5, "hash_ids": [1, 3]},
        {"timestamp": 2500, "input_length": 30, "output_length": 7, "hash_ids": []},
    ]
    p = write(tmp_path, "m.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    t = load_mooncake(p)
    assert t.arrival.tolist() == [0.0, 0.0, 2.5]
    assert [h.tolist() for h in t.block_hashes] == [[1, 2], [1, 3], []]
    with pytest.raises(TraceError, match="line 2, field 'timestamp'.*repeats"):
        load_mooncake(p, duplicates=False)
    bad = write(tmp_path, "b.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1, '
                '"hash_ids": "x"}\n')  # fmt: skip
    with pytest.raises(TraceError, match="b.jsonl: line 1, field 'hash_ids'"):
        load_mooncake(bad)


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_generic_table_with_a_column_mapping_in_any_format(tmp_path, fmt):
    frame = pd.DataFrame(
        {"ts": [1000, 1500, 4000], "who": ["a", "b", "a"], "p": [5, 6, 7], "o": [1, 2, 3]}
    )
    p = tmp_path / f"t.{fmt}"
    if fmt == "csv":
        frame.to_csv(p, index=False)
    elif fmt == "parquet":
        frame.to_parquet(p)
    else:
        p.write_text("\n".join(frame.apply(lambda r: r.to_json(), axis=1)))
    t = load_table(
        p,
        {"arrival": "ts", "client": "who", "prompt_len": "p", "output_len": "o"},
        time_unit="ms",
    )
    assert t.arrival.tolist() == [0.0, 0.5, 3.0] and t.client_names == ("a", "b")
    assert t.output_len.tolist() == [1, 2, 3]


def test_lengths_workload_pairs_file_lengths_with_an_arrival_process(tmp_path):
    p = write(tmp_path, "l.csv", "num_prefill_tokens,num_decode_tokens\n10,1\n20,2\n30,3\n")
    w = LengthsWorkload(str(p), Poisson(5.0), duration=200.0)
    t = w.build(0)
    assert abs(len(t) / 200.0 - 5.0) < 0.5
    # every request is one of the file's (prompt, output) pairs
    assert set(zip(t.prompt_len.tolist(), t.output_len.tolist())) <= {(10, 1), (20, 2), (30, 3)}
    assert np.array_equal(w.build(0).prompt_len, t.prompt_len)
    assert w.configured_rate() == 5.0


# ---- validation -------------------------------------------------------------------------------
HEADER = "arrival,prompt_len,output_len\n"


@pytest.mark.parametrize(
    "body, match",
    [
        ("arrival,prompt_len\n0,1\n", "field 'output_len': missing column"),
        (HEADER + "0,1,1\n1,x,1\n", "line 3, field 'prompt_len': got 'x'"),
        (HEADER + "0,1,1\n1,5,-2\n", "line 3, field 'output_len': got -2"),
        (HEADER + "0,1,1\n1,5,\n", "line 3, field 'output_len': got nan"),
        (HEADER + "0,1,1\n,5,2\n", "line 3, field 'arrival': got nan"),
        (HEADER + "0,1,1\n2,5,2\n1,5,2\n", "line 4, field 'arrival'.*or sort=true"),
        (HEADER + "0,1,1\n0,5,2\n", "line 3, field 'arrival': timestamp 0.0 repeats"),
        ("", "the file is empty"),
        (HEADER, "no data rows"),
        (HEADER.encode() + b"0,1,1\n1,\xe9\xff,1\n", r"line 3 is not UTF-8"),
    ],
)
def test_malformed_files_name_the_file_row_and_field(tmp_path, body, match):
    p = write(tmp_path, "bad.csv", body)
    with pytest.raises(TraceError, match=match) as info:
        load_table(p)
    assert str(p) in str(info.value) and "accepted" in str(info.value)


def test_errors_name_the_files_own_line_in_csv_and_jsonl_alike(tmp_path):
    # blank lines are skipped by the reader but still counted, as an editor counts them
    csv = write(tmp_path, "gaps.csv", HEADER + "0,1,1\n\n   \n1,x,1\n")
    with pytest.raises(TraceError, match="line 5, field 'prompt_len'"):
        load_table(csv)
    jsonl = write(
        tmp_path,
        "gaps.jsonl",
        '{"arrival": 0, "prompt_len": 1, "output_len": 1}\n\n'
        '{"arrival": 1, "prompt_len": "x", "output_len": 1}\n',
    )
    with pytest.raises(TraceError, match="line 3, field 'prompt_len'"):
        load_table(jsonl)
    # sorting first still names the line the bad row sits on
    unsorted = write(tmp_path, "u.csv", HEADER + "5,1,1\n0,2,2\n0,3,3\n")
    with pytest.raises(TraceError, match="line 4, field 'arrival': timestamp 0.0 repeats"):
        load_table(unsorted, sort=True)
    parquet = tmp_path / "bad.parquet"
    pd.DataFrame({"arrival": [0.0, 1.0], "prompt_len": [1, -3], "output_len": [1, 1]}).to_parquet(
        parquet
    )
    with pytest.raises(TraceError, match="row 2, field 'prompt_len': got -3"):
        load_table(parquet)


def test_unsorted_and_duplicate_timestamps_can_be_allowed(tmp_path):
    p = write(tmp_path, "u.csv", HEADER + "2,1,1\n0,2,2\n0,3,3\n")
    t = load_table(p, sort=True, duplicates=True)
    assert t.arrival.tolist() == [0.0, 0.0, 2.0] and t.prompt_len.tolist() == [2, 3, 1]
    with pytest.raises(TraceError, match="repeats"):
        load_table(p, sort=True)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(TraceError, match="trace file not found"):
        load_table(tmp_path / "nope.csv")
    p = write(tmp_path, "x.txt", HEADER + "0,1,1\n")
    with pytest.raises(TraceError, match="format '.txt' unknown"):
        load_table(p)
    with pytest.raises(TraceError, match="column mapping \\['when'\\] unknown"):
        load_table(write(tmp_path, "y.csv", HEADER + "0,1,1\n"), {"when": "t"})


def test_unfit_requests_are_counted_before_the_run_as_the_engine_refuses_them():
    from traces import Trace

    t = Trace.from_columns(
        client=["a"] * 5,
        arrival=[0, 1, 2, 3, 4],
        prompt_len=[100, 5000, 3100, 200, 9995],
        output_len=[10, 10, 10, 9900, 10],
    )
    cfg = SLoRAConfig(pool_tokens=10_000, batch_max_tokens=3072)
    cost = LinearStepCost(0.01, 0.0, 0.0, prefill_per_token=1e-4)
    report = unfit(t, cfg, cost)
    assert report == {"kv_pool_too_small": 2, "prompt_exceeds_batch_max_tokens": 2}
    r = simulate(t, FCFS(), cost, cfg).requests_frame()
    assert r[r.status == "refused"].reason.value_counts().to_dict() == report


# ---- fuzzing ------------------------------------------------------------------------------------
CELLS = st.sampled_from(["0", "1", "-1", "2.5", "", "nan", "x", "1e400", '"', "1,2", " ", "10"])
LINES = st.lists(st.lists(CELLS, min_size=0, max_size=5).map(",".join), max_size=6)
HEADERS = st.sampled_from(
    [
        HEADER.strip(),
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "arrived_at,num_prefill_tokens,num_decode_tokens",
        "a,b",
        "",
    ]
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(header=HEADERS, lines=LINES, junk=st.binary(max_size=8))
def test_fuzzed_csv_files_raise_only_trace_errors(tmp_path, header, lines, junk):
    p = tmp_path / "f.csv"
    p.write_bytes(("\n".join([header, *lines]) + "\n").encode() + junk)
    for loader in (load_table, load_azure, load_vidur):
        try:
            trace = loader(p)
        except TraceError as err:
            assert str(p) in str(err)
        else:
            assert len(trace) >= 1 and np.all(np.diff(trace.arrival) > 0)


@pytest.mark.slow
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.dictionaries(
            st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "x"]),
            st.one_of(
                st.integers(-5, 10**6),
                st.floats(allow_nan=True),
                st.text(max_size=3),
                st.lists(st.integers(0, 9), max_size=3),
                st.none(),
            ),
        ),
        max_size=5,
    ),
    junk=st.sampled_from(["", "{", "[1]", "null"]),
)
def test_fuzzed_jsonl_files_raise_only_trace_errors(tmp_path, rows, junk):
    p = tmp_path / "f.jsonl"
    p.write_text("\n".join([*(json.dumps(r) for r in rows), junk]))
    try:
        trace = load_mooncake(p)
    except TraceError as err:
        assert str(p) in str(err)
    else:
        assert len(trace) >= 1


# ---- ServeGen pools ------------------------------------------------------------------------------
def servegen_pool(folder, malicious=False):
    folder.mkdir()
    rows0 = [f"{600 * w},2.0,1.0,Gamma,1.0,0.5" for w in range(12)]  # 2 req/s, Poisson
    rows1 = [f"{600 * w},{0 if w % 2 else 1.0},0.8,{'' if w % 2 else 'Weibull'},1.3,1.08"
             for w in range(12)]  # fmt: skip
    (folder / "chunk-0-trace.csv").write_text("\n".join(rows0) + "\n")
    (folder / "chunk-1-trace.csv").write_text("\n".join(rows1) + "\n")
    pmf = "__import__('os').getcwd()" if malicious else "{100: 0.5, 300: 0.5}"
    doc = {"0": {"input_tokens": pmf, "output_tokens": "{7: 1.0}"}}
    (folder / "chunk-0-dataset.json").write_text(json.dumps(doc))  # client 1 has no PMFs
    return folder


def test_servegen_pool_scales_to_the_target_rate_and_samples_the_pmfs(tmp_path):
    pool = servegen_pool(tmp_path / "pool")
    assert [c.client_id for c in load_servegen_pool(pool)] == [0, 1]
    # mean total rate over [0, 7200): 2.0 + 0.5 = 2.5 req/s -> scaled to 10 req/s
    t = ServeGenPool(str(pool), target_rate=10.0, duration=7200.0).build(0)
    assert len(t) / 7200.0 == pytest.approx(10.0, rel=0.03)
    counts = np.bincount(t.client)
    assert counts[0] / len(t) == pytest.approx(0.8, abs=0.02)
    assert set(t.prompt_len.tolist()) == {100, 300} and set(t.output_len.tolist()) == {7}
    assert "1 client-windows with pool-wide length PMFs" in t.source
    again = ServeGenPool(str(pool), target_rate=10.0, duration=7200.0).build(0)
    assert np.array_equal(again.arrival, t.arrival)


def test_servegen_pmfs_are_parsed_as_literals_never_evaluated(tmp_path):
    pool = servegen_pool(tmp_path / "pool", malicious=True)
    with pytest.raises(TraceError, match="window 0, field 'input_tokens': not a dict literal"):
        ServeGenPool(str(pool), target_rate=1.0, duration=600.0).build(0)


# ---- real files (skip without ../shared/data) --------------------------------------------------
def test_real_azure_and_vidur_files():
    # row counts and means of the files as published (read once with pandas, not the loaders)
    code = load_azure(shared_file("azure2023/code.csv"))
    conv = load_azure(shared_file("azure2023/conv.csv"))
    vidur = load_vidur(shared_file("azure2023/conv_vidur_format.csv"))
    assert (len(code), len(conv), len(vidur)) == (8819, 19366, 19366)
    assert code.prompt_len.mean() == pytest.approx(2048, abs=1)
    assert code.output_len.mean() == pytest.approx(28, abs=0.5)
    assert trace_stats(code)["interarrival_cv"] == pytest.approx(13, abs=0.5)
    assert conv.prompt_len.mean() == pytest.approx(1155, abs=1)
    assert trace_stats(conv)["rate_per_s"] == pytest.approx(5.5, abs=0.05)
    assert np.array_equal(vidur.prompt_len, conv.prompt_len)
    assert np.allclose(vidur.arrival, conv.arrival, atol=1e-6)


@pytest.mark.slow
def test_real_vtc_etalon_and_servegen_files():
    # row and client counts of the files as published (counted once with pandas and tarfile)
    vtc = load_vtc_real(shared_file("vtc/real_trace.csv"))
    assert len(vtc) == 1500 and vtc.num_clients == 27
    rows = [
        load_lengths(shared_file(f"etalon_lengths/{name}.csv"))[0].size
        for name in (
            "sharegpt_8k_filtered_stats_llama2_tokenizer",
            "arxiv_summarization_stats_llama2_tokenizer_filtered_v2",
            "bwb_stats_llama2_tokenizer_filtered_v2",
        )
    ]
    assert rows == [30731, 28257, 33768]
    pool_path = shared_file("servegen/language_m-small.tar.gz")
    assert len(load_servegen_pool(pool_path)) == 43
    t = ServeGenPool(str(pool_path), target_rate=5.0, duration=3600.0, start=36000.0).build(0)
    assert t.num_clients == 43 and len(t) / 3600.0 == pytest.approx(5.0, rel=0.1)


def test_trace_workload_config_runs_the_real_azure_trace():
    from traces import Window

    w = TraceWorkload(str(shared_file("azure2023/conv.csv")), "azure", transforms=[Window(0, 60)])
    t = w.build(0)
    assert 0 < len(t) < 19366 and t.arrival.max() < 60


# ---- fairsim-trace-stats ---------------------------------------------------------------------
def test_trace_stats_prints_json_and_saves_a_plot(tmp_path, capsys):
    p = write(tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
              + "".join(f"{i * 0.5},{10 + i},{1 + i % 3}\n" for i in range(40)))  # fmt: skip
    assert detect_format(p) == "vidur"
    png = tmp_path / "s.png"
    main([str(p), "--plot", str(png)])
    stats = json.loads(capsys.readouterr().out)
    assert stats["format"] == "vidur" and stats["rows"] == 40
    assert stats["duration_s"] == 19.5 and stats["rate_per_s"] == pytest.approx(2.0)
    assert stats["interarrival_cv"] == pytest.approx(0.0, abs=1e-9)
    assert stats["clients"] == {"vidur": 1.0}
    assert stats["prompt_len"]["p50"] == 29.5 and stats["output_len"]["max"] == 3
    assert png.stat().st_size > 0


def test_trace_stats_detects_the_agentic_sessions_by_their_header(tmp_path, capsys):
    header = "trace_id,agent_id,subagent_type,req_idx,t_abs_s,in_tokens,out_tokens,think_time_s"
    header += ",stop"
    rows = ["s1,main,,0,0.0,100,5,0.0,tool_use", "s1,main,,1,3.0,120,0,2.0,end_turn"]
    rows.append("s2,main,,0,1.0,90,7,0.0,end_turn")
    p = write(tmp_path, "sessions.csv", "\n".join([header, *rows]) + "\n")
    assert detect_format(p) == "agentic"
    main([str(p)])
    stats = json.loads(capsys.readouterr().out)
    assert stats["format"] == "agentic" and stats["rows"] == 3
    assert stats["clients"] == {"s1": round(2 / 3, 6), "s2": round(1 / 3, 6)}
    assert stats["output_len"]["max"] == 7 and stats["prompt_len"]["max"] == 120


@pytest.mark.integration
def test_trace_stats_bad_file_is_one_line_and_exit_2(tmp_path):
    p = write(tmp_path, "bad.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,x\n")
    run = subprocess.run(
        [sys.executable, "-c", "from simulator.apps.data.trace_stats import main; main()", str(p)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "line 2, field 'num_decode_tokens'" in lines[0]
    assert "Traceback" not in run.stderr


def test_a_gzipped_table_reads_as_its_plain_file_and_a_corrupt_one_is_named(tmp_path):
    from traces.files import read_table

    plain = tmp_path / "t.csv"
    plain.write_text("arrival,client,prompt_len,output_len\n0.5,a,10,4\n\n1.5,b,20,8\n")
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    pd.testing.assert_frame_equal(read_table(packed), read_table(plain))
    assert list(read_table(packed).index) == [2, 4]  # rows keep their file lines
    assert detect_format(packed) == "table"
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(b"arrival,client\n1,a\n")
    with pytest.raises(TraceError, match=r"broken\.csv\.gz: not a readable gzip file"):
        read_table(broken)
