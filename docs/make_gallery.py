"""Execute every notebook under notebooks/ and save its figures as docs/gallery/<notebook>_<k>.png
(the README gallery). Default scale is the notebooks' own ("full"); `--scale ci` is quicker.

Usage: python docs/make_gallery.py [--scale full|ci] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

from simulator.apps.sweeps.notebook_run import execute

ROOT = Path(__file__).resolve().parents[1]


def figures(source: Path, scale: str) -> list[bytes]:
    nb = execute(source, scale)
    return [
        base64.b64decode(out["data"]["image/png"])
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.get("output_type") == "display_data" and "image/png" in out.get("data", {})
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="full", choices=("full", "ci"))
    parser.add_argument("--only", nargs="*", help="notebook names (default: all)")
    args = parser.parse_args()
    out = ROOT / "docs" / "gallery"
    out.mkdir(parents=True, exist_ok=True)
    for source in sorted((ROOT / "notebooks").glob("*.py")):
        if args.only and source.stem not in args.only:
            continue
        for k, png in enumerate(figures(source, args.scale)):
            path = out / f"{source.stem}_{k}.png"
            path.write_bytes(png)
            print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
