"""What a report is made of, whatever it is written as: sections of paragraphs, lists, tables and charts.

Text in a block is plain and may come from outside (a run's name, an operator's reason): each writer escapes it
for its format (``page``: HTML, ``ticket``: Markdown). A chart is drawn in HTML only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Heading:
    """A heading within a section (one incident of several)."""

    text: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Table:
    """Rows of text: every cell already formatted as it is shown."""

    frame: pd.DataFrame


@dataclass(frozen=True)
class Chart:
    figure: go.Figure


Block = Paragraph | Heading | Bullets | Table | Chart


@dataclass(frozen=True)
class Section:
    """One part of the report: an anchor (``key``), a title and its blocks in order."""

    key: str
    title: str
    blocks: list[Block] = field(default_factory=list)


@dataclass(frozen=True)
class Report:
    """A whole report: its title, where its numbers came from, and its sections."""

    title: str
    provenance: str
    sections: list[Section]
