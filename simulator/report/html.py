"""`report.html`: one self-contained page per run folder, for a browser.

It holds what the console printed (every client, not the busiest only), the run's facts, every
picture of the folder embedded (so the page can be mailed or moved alone), and links to the
folder's data files.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from simulator.report.console import format_fairness, format_qoe, format_slos, format_summary
from simulator.report.pictures import FLEET_FILE, KV_FILE, SERVICE_FILE, run_title
from simulator.report.run_folder import write_text_atomically

REPORT_FILE = "report.html"
# the run's own pictures first, then Veeksha's distributions in their documented order
CAPTIONS = {
    SERVICE_FILE: "Service each client received: cumulative, and per second over a window",
    KV_FILE: "KV-pool use, running batch and waiting queue over time",
    FLEET_FILE: "Replicas over time under the autoscaler, and the requests waiting",
    "metrics/ttfc.png": "Time to first token (TTFC), per client",
    "metrics/tbc.png": "Gaps between output tokens (TBC), per client",
    "metrics/tpot.png": "Time per output token (TPOT), per client",
    "metrics/e2e.png": "End-to-end latency, per client",
    "metrics/normalized_e2e.png": "End-to-end latency per output token, per client",
    "metrics/fluidity.png": "Fluidity-index (share of tokens on time), per client",
}
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
.what { color: #555; font-family: monospace; }
table.facts td { padding: 0.15em 1.2em 0.15em 0; }
pre { background: #f6f6f6; padding: 0.8em; white-space: pre-wrap; font-size: 0.85em; }
figure { margin: 1.2em 0; } img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.9em; }
"""


def write_report(folder: Path, summary: dict[str, Any]) -> Path:
    """report.html in `folder`, from its summary and its pictures."""
    path = folder / REPORT_FILE
    write_text_atomically(path, report_page(folder, summary))
    return path


def report_page(folder: Path, summary: dict[str, Any]) -> str:
    title = run_title(summary.get("what_ran"))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>fairsim: {html.escape(title)}</title><style>{STYLE}</style></head><body>",
        "<h1>fairsim run</h1>",
        f'<p class="what">{html.escape(title)}</p>',
        _facts(summary),
        _section("Per client", format_summary(summary, None)),
        _section("Fairness", format_fairness(summary, None)),
    ]
    if "qoe" in summary:
        parts.append(_section("Quality of experience", format_qoe(summary, None)))
    if (summary.get("slo_results") or {}).get("results"):
        parts.append(_section("SLOs", format_slos(summary["slo_results"])))
    parts.append("<h2>Pictures</h2>")
    parts += [_figure(folder / name, caption) for name, caption in _pictures(folder)]
    parts.append(_files(folder))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _facts(summary: dict[str, Any]) -> str:
    counts = summary.get("status_counts", {})
    kv = summary.get("kv_utilisation") or {}
    rows = [
        ("requests", f"{summary.get('requests', 0):,}"),
        ("outcome", ", ".join(f"{n:,} {status}" for status, n in counts.items())),
        ("throughput", f"{summary.get('throughput_tokens_per_s', 0.0):,.1f} tokens/s"),
        ("simulated time", f"{summary.get('end_time') or 0.0:,.1f} s"),
        ("KV pool", f"{summary.get('pool_tokens') or 0:,} tokens, mean use "
         f"{100 * (kv.get('mean') or 0.0):.1f}%, peak {100 * (kv.get('peak') or 0.0):.1f}%"),
        ("config digest", str(summary.get("config_digest", ""))),
    ]  # fmt: skip
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts">{cells}</table>'


def _section(heading: str, text: str) -> str:
    return f"<h2>{html.escape(heading)}</h2><pre>{html.escape(text)}</pre>"


def _pictures(folder: Path) -> list[tuple[str, str]]:
    """Every PNG of the folder (its metrics/ included): the known ones in CAPTIONS' order."""
    present = sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*.png") if ".hydra" not in p.parts
    )
    known = [(name, caption) for name, caption in CAPTIONS.items() if name in present]
    return known + [(name, name) for name in present if name not in CAPTIONS]


def _figure(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = html.escape(caption, quote=True)
    return (
        f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _files(folder: Path) -> str:
    """Links to the folder's data files (relative: they work where the folder is)."""
    names = sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in {".parquet", ".json", ".csv", ".gz", ".txt"}
        and ".hydra" not in p.parts
    )  # fmt: skip
    items = "".join(f'<li><a href="{html.escape(n)}">{html.escape(n)}</a></li>' for n in names)
    return f"<h2>Files</h2><ul>{items}</ul>"
