"""The validation report (simulator/apps/papers/validation.py, `fairsim-validation`): verdicts
follow their stated rules, the report lists every published number with the verdict its own figures
give, and the committed docs/validation.md covers every published number of Tables 2-6."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulator.apps.papers import fairserve_table, validation, vtc_tables
from simulator.apps.sweeps.replications import verdict

DOCS = Path(__file__).resolve().parents[1] / "docs" / "validation.md"
NUMBER = r"[-\d.,]+"
ROW = re.compile(  # | figure | published | median [p5, p95] | verdict |
    rf"^\| (?P<what>[^|]+) \| (?P<pub>[^|]+) \| (?P<med>{NUMBER}) "
    rf"\[(?P<p5>{NUMBER}), (?P<p95>{NUMBER})\] \| (?P<verdict>in|15%|out) \|"
)


def test_a_figure_is_in_when_the_interval_holds_it_or_a_value_that_rounds_to_it():
    values = [0.952] * 5
    assert verdict(values, 0.95) == "15%"  # 0.95 itself is not in [0.952, 0.952] ...
    assert verdict(values, 0.95, decimals=2) == "in"  # ... but 0.952 rounds to 0.95
    assert verdict(values, 0.94, decimals=2) == "15%"
    assert verdict([10.0, 11.0, 12.0], 11.5) == "in"


def test_a_published_range_is_in_when_it_overlaps_and_judged_by_its_nearest_end():
    assert verdict([20.0, 22.0, 24.0], (21.15, 25.0)) == "in"
    assert verdict([18.0, 18.5, 19.0], (21.15, 25.0)) == "15%"  # 21.15 is 14% above 18.5
    assert verdict([10.0, 10.5, 11.0], (21.15, 25.0)) == "out"
    assert verdict([28.0, 28.0], (21.15, 25.0)) == "15%"  # 25 is within 15% of 28
    assert verdict([30.0, 30.0], (21.15, 25.0)) == "out"  # 25 is 16.7% below 30


def _rows(text: str) -> list[dict[str, str]]:
    return [m.groupdict() for line in text.splitlines() if (m := ROW.match(line))]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.slow
def test_the_report_states_every_figure_with_the_verdict_its_numbers_give(tmp_path, capsys):
    out = tmp_path / "validation.md"
    argv = ["--replications", "2", "--table", "5", "--section", "vtc-tables"]
    validation.main([*argv, "--section", "etalon", "--out", str(out)])
    text = out.read_text()
    assert f"`fairsim-validation {' '.join(argv)}" in text
    rows = _rows(text)
    table5 = [r for r in vtc_tables.ROWS if r.table == "5"]
    published = sum(
        getattr(r, attr) is not None for r in table5 for _, _, attr, _ in validation.VTC_METRICS
    )
    assert sum(r["what"].startswith("Table 5 ·") for r in rows) == published
    for r in rows:
        if "to" in r["pub"]:
            continue  # a published range
        pub, p5, p95 = (_number(r[k]) for k in ("pub", "p5", "p95"))
        # shown rounded to 2 decimals: in needs the figure within [p5, p95] give or take that
        if r["verdict"] == "in":
            assert p5 - 0.01 <= pub <= p95 + 0.01, r
        else:
            assert not p5 + 0.01 <= pub <= p95 - 0.01, r
    etalon = {r["what"]: r["verdict"] for r in rows if "stall" in r["what"]}
    assert etalon and set(etalon.values()) == {"in"}  # Etalon's example, exactly
    summary = capsys.readouterr().out.splitlines()[0]
    assert f"{len(rows)} published numbers" in summary


def test_every_reason_names_a_published_figure():
    rows = {(r.table, r.label): r for r in vtc_tables.ROWS}
    attr = {key: attr for key, _, attr, _ in validation.VTC_METRICS}
    for key in validation.REASONS:
        kind, *rest = key.split("/")
        if kind == "vtc":
            table, label, metric = rest
            row = rows[(table, label)]
            if metric in attr:
                assert getattr(row, attr[metric]) is not None, key
            else:
                assert table == "2" and metric in validation.VTC_RESPONSE[label], key
        elif kind == "fairserve":
            experiment, policy, metric = rest
            assert metric in fairserve_table.PAPER.get((experiment, policy), {}), key
        else:
            assert kind in {"suites", "etalon"}, key


def test_the_committed_report_lists_every_published_number_of_tables_2_to_6():
    if not DOCS.exists():
        pytest.fail("docs/validation.md is missing: run fairsim-validation")
    rows = _rows(DOCS.read_text())
    expected = sum(
        getattr(r, attr) is not None
        for r in vtc_tables.ROWS
        for _, _, attr, _ in validation.VTC_METRICS
    ) + sum(len(v) for v in validation.VTC_RESPONSE.values())
    assert sum(r["what"].startswith("Table ") and "seed varied" not in r["what"]
               for r in rows) == expected  # fmt: skip
    assert "replications" in DOCS.read_text().split("\n\n")[1]


def test_table_without_the_vtc_tables_section_is_an_input_error_not_ignored(tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:
        validation.main(["--section", "etalon", "--table", "5", "--out", str(tmp_path / "v.md")])
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--table chooses VTC tables" in err[0]
    assert not (tmp_path / "v.md").exists()


def test_regenerating_one_section_keeps_every_other_one_and_recounts_the_total(tmp_path):
    """`--section etalon` into an existing report replaces only the Etalon section and its
    summary line; the other sections stay word for word and the total is recounted."""
    other = validation.Section(
        "Alpha paper",
        "An intro that must survive.",
        findings=[
            validation.Finding("alpha/x", "Alpha · x", 1.0, [1.0, 1.0]),
            validation.Finding("alpha/y", "Alpha · y", 5.0, [1.0, 1.0]),
        ],
    )
    stale = validation.etalon_section()
    stale.findings = stale.findings[:1]  # an Etalon section older than today's
    out = tmp_path / "validation.md"
    out.write_text(validation.render([other, stale], 2, "fairsim-validation") + "\n")
    before = out.read_text()
    assert "All 3 published numbers: 2 in [p5, p95], 0 within 15%, 1 out." in before
    validation.main(["--section", "etalon", "--replications", "2", "--out", str(out)])
    after = out.read_text()
    alpha = before[before.index("## Alpha paper") : before.index("## Etalon")]
    assert alpha in after and "- Alpha paper: 1 in [p5, p95], 0 within 15%, 1 out" in after
    fresh = validation.etalon_section()
    stalls = [r for r in _rows(after) if "stall" in r["what"]]
    assert after.count("## Etalon") == 1 and len(stalls) == len(fresh.findings)
    assert f"- Etalon: {len(fresh.findings)} in [p5, p95], 0 within 15%, 0 out" in after
    total = 1 + len(fresh.findings)
    assert f"All {total + 1} published numbers: {total} in [p5, p95], 0 within 15%, 1 out." in after
    # a whole report anew (no --section) keeps a section written by hand, not the stale rest
    whole = validation.render([fresh], 2, "fairsim-validation")
    merged = validation.merge_into(after + "\n## By hand\n\nNotes.\n", whole, None)
    etalon = whole[whole.index("## Etalon") :].rstrip("\n")
    assert etalon in merged and merged.endswith("\n\n## By hand\n\nNotes.\n")
    assert "## Alpha paper" in merged  # a section the new report lacks is kept too
    # into a file that does not exist yet: a report of the chosen sections alone
    validation.main(
        ["--section", "etalon", "--replications", "2", "--out", str(tmp_path / "new.md")]
    )
    assert "## Alpha paper" not in (tmp_path / "new.md").read_text()
