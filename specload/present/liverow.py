"""A level's figures as the web page's live view shows them: one row of the figure table
(specload.analysis.figures) per level, and the live table's columns, so that the page
(specload/locust/webpage/app.js) draws whatever the table says without a list of its own."""

from __future__ import annotations

import math
from typing import Any

from specload.analysis import figures
from specload.analysis.metrics import LevelStats
from specload.core.text import MISSING
from specload.present.report import figure_cell


def live_row(s: LevelStats | None) -> dict[str, Any]:
    """A level's figures by JSON field for the web page: every number of the figure table rounded as
    its table shows it (a share to its percent's digits), and the live table's other cells as text
    (None: no value yet)."""
    out: dict[str, Any] = {}
    for f in figures.FIGURES:
        if f.numeric:
            v = f.number(s) if s is not None else None
            out[f.field] = None if v is None else round(v, f.digits + round(math.log10(f.scale)))
        elif f.live:  # the report's cell, None for none
            cell = figure_cell(f, s) if s is not None else MISSING
            out[f.field] = None if cell == MISSING else cell
    return out


def live_columns() -> list[dict[str, Any]]:
    """The live table's figure columns, in order (webpage/app.js draws them)."""
    return [
        {
            "field": f.field,
            "header": f.header,
            "digits": f.digits,
            "scale": f.scale,
            "show": f.show,
            "text": not f.numeric,
        }
        for f in figures.FIGURES
        if f.live
    ]


def live_charts() -> list[dict[str, Any]]:
    """The web page's charts against the level axis (figures.CHARTS, in page order; webpage/app.js
    draws them from the finished levels' rows, by JSON field)."""
    return [
        {
            "id": ch.page_id,
            "key": ch.key,
            "title": ch.title,
            "y_label": ch.y_label,
            "lines": [{"field": figures.BY_KEY[k].field, "name": name} for k, name in ch.lines],
            "if_value": ch.if_value,
        }
        for ch in figures.CHARTS
    ]
