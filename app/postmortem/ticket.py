"""A report as a Markdown ticket: the same sections and lines as the HTML page, without its charts.

Outside text is escaped here (``text``): control and format characters shown as their escapes (so the ticket is
safe on a terminal too), HTML's special characters as entities (a tracker renders raw HTML), and the characters
that Markdown reads as markup (emphasis, links, code, table cells) behind a backslash.
"""

from __future__ import annotations

import html
import re

import pandas as pd

from bedside.collectors.display_text import visible

from .blocks import Block, Bullets, Chart, Heading, Paragraph, Report, Table

MARKUP = re.compile(r"([\\`*_\[\]|~])")
"""What Markdown reads as markup within a line: escapes, code, emphasis, links, table cells, strikethrough."""


def render_ticket(report: Report) -> str:
    """The report as Markdown, charts left out (the HTML report draws them)."""
    lines = [f"# {text(report.title)}", "", text(report.provenance), ""]
    for section in report.sections:
        shown = [_block(block) for block in section.blocks if not isinstance(block, Chart)]
        if shown:
            lines += [f"## {text(section.title)}", "", *(part + "\n" for part in shown)]
    return "\n".join(lines).rstrip() + "\n"


def text(value: object) -> str:
    """Outside text made safe to place in Markdown, on one line."""
    return MARKUP.sub(r"\\\1", html.escape(visible(str(value)), quote=False))


def _block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return text(block.text)
    if isinstance(block, Heading):
        return f"### {text(block.text)}"
    if isinstance(block, Bullets):
        return "\n".join(f"- {text(item)}" for item in block.items)
    assert isinstance(block, Table)
    return _table(block.frame)


def _table(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(text(name) for name in frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = ["| " + " | ".join(text(cell) for cell in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *rows])
