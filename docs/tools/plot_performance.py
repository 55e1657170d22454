"""Draws docs/img/performance.svg from the JSON that ``acollect bench --json`` writes.

One panel per workload, one bar per contender: median frames/s, with the ratio to the
in-process hand loop printed beside each bar. Plain SVG written by hand, so the plot needs
nothing beyond the standard library and looks the same wherever it is regenerated.

    acollect bench --rounds 3 --json docs/data/bench.json
    python docs/tools/plot_performance.py docs/data/bench.json --output docs/img/performance.svg
"""

from __future__ import annotations

import argparse
import json
from html import escape
from pathlib import Path
from typing import Any

WIDTH = 960
LEFT = 330  # room for the contender names
RIGHT = 150  # room for the figures beside the bars
BAR_H, GAP, PANEL_GAP, TITLE_H = 26, 10, 34, 48
COLOURS = {"hand loop": "#8c8c8c", "acollect": "#1f6fd1", "torchrl": "#e07b00"}


def _colour(name: str) -> str:
    return next((c for prefix, c in COLOURS.items() if name.startswith(prefix)), "#4f9a61")


def _text(x: float, y: float, body: str, **attrs: Any) -> str:
    extra = " ".join(f'{k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" {extra}>{escape(body)}</text>'


def render(reports: list[dict[str, Any]]) -> str:
    """The SVG document for ``acollect bench --json`` reports taken on one machine (one panel per workload run)."""
    first = reports[0]
    panels = [(name, w) for report in reports for name, w in report["workloads"].items()]
    # A contender that did not run (torchrl not installed) has no bar to draw.
    panels = [(name, w, [r for r in w["results"] if r["median"] is not None]) for name, w in panels]
    height = 70 + sum(TITLE_H + len(rows) * (BAR_H + GAP) + PANEL_GAP for _, _, rows in panels)
    machine = f"{first['cores']} cores (Python {first['python']}, torch {first['torch']})"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        'font-family="Helvetica, Arial, sans-serif" font-size="14">',
        "<title>acollect bench: median frames per second of each contender, and its ratio to the hand loop</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" rx="14" fill="#ffffff"/>',
        _text(20, 32, f"acollect bench: frames/s on {machine}", font_weight="bold", font_size="16", fill="#1b2a3a"),
        _text(
            20,
            52,
            "median of the rounds; in brackets, the ratio to the in-process hand loop doing the same work",
            fill="#3d4b5c",
            font_size="13",
        ),
    ]
    y = 70.0
    span = WIDTH - LEFT - RIGHT
    for name, workload, rows in panels:
        parts.append(_text(20, y + 22, f"{name}: {workload['title']}", font_weight="bold", fill="#1b2a3a"))
        y += TITLE_H
        top = max(r["median"] for r in rows) if rows else 1.0
        for r in rows:
            label = r["name"]
            parts.append(_text(LEFT - 10, y + BAR_H * 0.68, label, text_anchor="end", fill="#1b2a3a"))
            width = max(1.0, span * r["median"] / top)
            parts.append(f'<rect x="{LEFT}" y="{y:.1f}" width="{width:.1f}" height="{BAR_H}" rx="3" '
                         f'fill="{_colour(label)}"/>')  # fmt: skip
            figure = f"{r['median']:,.0f}"
            if r.get("vs_hand_loop") is not None:
                figure += f"  ({r['vs_hand_loop']:.2f}x)"
            parts.append(_text(LEFT + width + 8, y + BAR_H * 0.68, figure, fill="#1b2a3a"))
            y += BAR_H + GAP
        y += PANEL_GAP
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("reports", type=Path, nargs="+", help="JSON files written by `acollect bench --json`")
    parser.add_argument("--output", type=Path, required=True, help="where to write the SVG")
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text(encoding="utf-8")) for path in args.reports]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render(reports), encoding="utf-8")


if __name__ == "__main__":
    main()
