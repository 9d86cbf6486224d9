"""A report as one self-contained HTML page: plotly.js inlined once in the head, every chart a plot of it, no
file or address outside the page, so it opens offline and can be attached to a ticket.

Every text from the report is escaped here (``text``): HTML's special characters as entities, control and format
characters (a bidi override that would disguise what follows) as their visible escapes. Charts carry their data
as JSON, in which plotly writes ``<``, ``>`` and ``&`` as unicode escapes, so no string can end the script.
"""

from __future__ import annotations

import html
from collections.abc import Iterator

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from bedside.collectors.display_text import visible

from .blocks import Block, Bullets, Chart, Heading, Paragraph, Report, Table

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 0 24px 48px; color: #111827; }
h1 { margin-bottom: 4px; } h2 { border-bottom: 1px solid #e5e7eb; padding-bottom: 4px; margin-top: 36px; }
h3 { font-size: 16px; margin: 20px 0 6px; }
nav a { margin-right: 12px; } .provenance { color: #6b7280; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #e5e7eb; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f9fafb; } tbody tr:nth-child(even) { background: #fcfcfd; }
"""
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def render_page(report: Report) -> str:
    """The report as a whole HTML document."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{text(report.title)}</title>",
            f"<style>{STYLE}</style>",
            f'<script type="text/javascript">{get_plotlyjs()}</script>',
            "</head><body>",
            f"<h1>{text(report.title)}</h1>",
            f'<p class="provenance">{text(report.provenance)}</p>',
            "<nav>" + "".join(f'<a href="#{s.key}">{text(s.title)}</a>' for s in report.sections) + "</nav>",
            *(part for section in report.sections for part in _section(section.key, section.title, section.blocks)),
            "</body></html>",
        ]
    )


def text(value: object) -> str:
    """Outside text made safe to place in HTML: its hidden characters visible, its special characters entities."""
    return html.escape(visible(str(value)))


def _section(key: str, title: str, blocks: list[Block]) -> Iterator[str]:
    yield f'<section id="{key}"><h2>{text(title)}</h2>'
    yield from (_block(block) for block in blocks)
    yield "</section>"


def _block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{text(block.text)}</p>"
    if isinstance(block, Heading):
        return f"<h3>{text(block.text)}</h3>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{text(item)}</li>" for item in block.items) + "</ul>"
    if isinstance(block, Table):
        return _table(block.frame)
    return _chart(block)


def _table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{text(name)}</th>" for name in frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{text(cell)}</td>" for cell in row) + "</tr>" for row in frame.itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _chart(chart: Chart) -> str:
    return pio.to_html(chart.figure, include_plotlyjs=False, full_html=False, config=PLOT_CONFIG)
