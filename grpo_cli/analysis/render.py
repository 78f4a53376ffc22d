"""The report as typed blocks, and the one renderer that writes them as Markdown (summary.md,
the --write-docs blocks) or as a self-contained HTML page (report.html, figures embedded).

Sections (analysis/report.py) decide what is said and return blocks; nothing here decides a
number or a word. Each block type renders itself in both formats, so the two files always say
the same thing.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


def fmt(value, digits: int = 2) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if isinstance(value, float | np.floating):
        return f"{value + 0.0 if abs(value) >= 10 ** -(digits + 1) else 0.0:.{digits}f}"
    return str(value)


def compact(table: pd.DataFrame) -> pd.DataFrame:
    """For display: no all-empty variant column, `R` for the group size."""
    if "variant" in table and table["variant"].fillna("").eq("").all():
        table = table.drop(columns=["variant"])
    return table.rename(columns={"group_size": "R"})


def md_table(table: pd.DataFrame) -> str:
    if table.empty:
        return "_(no data)_"
    cells = [[fmt(v, 3).replace("|", "\\|") for v in row] for row in table.itertuples(index=False)]
    header = "| " + " | ".join(str(c).replace("|", "\\|") for c in table.columns) + " |"
    lines = [header, "|" + "---|" * len(table.columns)] + [
        "| " + " | ".join(r) + " |" for r in cells
    ]
    return "\n".join(lines)


CSS_CLASSES = {"supported": "supported", "contradicted": "contradicted", "failed": "contradicted",
               "inconclusive": "inconclusive", "mixed": "inconclusive",
               "incomplete": "inconclusive"}
CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;margin:0.5em 0;font-size:0.85em}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f0f0f0}
td.supported{background:#d9f2d9}td.inconclusive{background:#fff3c4}td.contradicted{background:#f9d6d5}
.claim{display:flex;gap:1.5em;align-items:flex-start;border-top:1px solid #ddd;padding-top:0.5em}
.claim .text{flex:1 1 50%}.claim img{flex:0 1 45%;max-width:45%}details{margin:0.5em 0}
blockquote{border-left:4px solid #888;margin:0.5em 0;padding:0.3em 1em;background:#f7f7f7}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}li{margin:0.2em 0}"""


def html_table(table: pd.DataFrame) -> str:
    if table.empty:
        return "<p><em>(no data)</em></p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = []
    for row in table.itertuples(index=False):
        cells = []
        for value in row:
            text = fmt(value, 3)
            css = f' class="{CSS_CLASSES[text]}"' if text in CSS_CLASSES else ""
            cells.append(f"<td{css}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _img(name: str, path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'


def _items(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>"


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2  # 1: the page's title

    def markdown(self) -> str:
        return f"{'#' * self.level} {self.text}"

    def html(self, figures: dict[str, Path]) -> str:
        return f"<h{self.level}>{html.escape(self.text)}</h{self.level}>"


@dataclass(frozen=True)
class Paragraph:
    text: str

    def markdown(self) -> str:
        return self.text

    def html(self, figures: dict[str, Path]) -> str:
        return f"<p>{html.escape(self.text)}</p>"


@dataclass(frozen=True)
class Quote:
    text: str

    def markdown(self) -> str:
        return f"> {self.text}"

    def html(self, figures: dict[str, Path]) -> str:
        return f"<blockquote>{html.escape(self.text)}</blockquote>"


@dataclass(frozen=True)
class Bullets:
    items: list[str]

    def markdown(self) -> str:
        return "\n".join(f"- {item}" for item in self.items) or "_(none)_"

    def html(self, figures: dict[str, Path]) -> str:
        return _items(self.items)


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame

    def markdown(self) -> str:
        return md_table(compact(self.frame))

    def html(self, figures: dict[str, Path]) -> str:
        return html_table(compact(self.frame))


@dataclass(frozen=True)
class Details:
    """A list folded away in HTML under its summary line."""

    summary: str
    items: list[str]

    def markdown(self) -> str:
        return f"{self.summary}:\n\n" + ("\n".join(f"- {i}" for i in self.items) or "_(none)_")

    def html(self, figures: dict[str, Path]) -> str:
        return (f"<details><summary>{html.escape(self.summary)}</summary>{_items(self.items)}"
                "</details>")


@dataclass(frozen=True)
class ClaimBlock:
    """A claim's verdict and sentences beside its figure; its rule and table (folded in HTML)."""

    heading: str
    figure: str | None  # figures.py registry name
    sentences: list[str]
    rule: str
    table: pd.DataFrame

    def markdown(self) -> str:
        parts = [f"### {self.heading}"]
        if self.figure:
            parts.append(f"![{self.figure}]({self.figure}.png)")
        parts.append("\n".join(f"- {line}" for line in self.sentences))
        parts.append(f"> Rule: {self.rule}")
        if not self.table.empty:
            parts.append(md_table(compact(self.table)))
        return "\n\n".join(parts)

    def html(self, figures: dict[str, Path]) -> str:
        text = (f"<h3>{html.escape(self.heading)}</h3>" + _items(self.sentences)
                + "<details><summary>Rule and numbers</summary><blockquote>"
                f"{html.escape(self.rule)}</blockquote>"
                + (html_table(compact(self.table)) if not self.table.empty else "")
                + "</details>")
        image = _img(self.figure, figures[self.figure]) if self.figure in figures else ""
        return f'<div class="claim"><div class="text">{text}</div>{image}</div>'


@dataclass(frozen=True)
class Headline:
    """A claim's answer: its verdict, the one sentence that says what decided it, its figure."""

    heading: str
    sentence: str
    figure: str | None  # figures.py registry name

    def markdown(self) -> str:
        image = f"\n\n![{self.figure}]({self.figure}.png)" if self.figure else ""
        return f"### {self.heading}\n\n{self.sentence}{image}"

    def html(self, figures: dict[str, Path]) -> str:
        text = f"<h3>{html.escape(self.heading)}</h3><p>{html.escape(self.sentence)}</p>"
        image = _img(self.figure, figures[self.figure]) if self.figure in figures else ""
        return f'<div class="claim"><div class="text">{text}</div>{image}</div>'


@dataclass(frozen=True)
class Link:
    """A pointer to a file written beside summary.md (details.md, a CSV)."""

    text: str
    target: str

    def markdown(self) -> str:
        return f"{self.text}: [{self.target}]({self.target})"

    def html(self, figures: dict[str, Path]) -> str:
        return f"<p>{html.escape(self.text)}: {html.escape(self.target)}</p>"


@dataclass(frozen=True)
class Fold:
    """A section of evidence: a heading and its blocks in Markdown (details.md), folded away
    under its title in HTML (report.html)."""

    title: str
    blocks: tuple

    def markdown(self) -> str:
        return "\n\n".join([f"## {self.title}", *(b.markdown() for b in self.blocks)])

    def html(self, figures: dict[str, Path]) -> str:
        inner = "".join(b.html(figures) for b in self.blocks)
        return f"<details><summary>{html.escape(self.title)}</summary>{inner}</details>"


Block = Heading | Paragraph | Quote | Bullets | Table | Details | ClaimBlock | Headline | Link | Fold


def render_markdown(content: list[Block]) -> str:
    return "\n\n".join(block.markdown() for block in content) + "\n"


def render_html(content: list[Block], figures: dict[str, Path], captions: dict[str, str]) -> str:
    """The page: every block, then, folded, each figure that no claim shows, with its caption;
    images embedded, so the page needs no other file."""
    parts = [block.html(figures) for block in content]
    shown = {block.figure for block in content
             if isinstance(block, ClaimBlock | Headline) and block.figure}
    others = [f"<h3>{html.escape(name)}</h3><p>{html.escape(captions.get(name, ''))}</p>"
              + _img(name, path) for name, path in figures.items() if name not in shown]
    if others:
        parts.append("<details><summary>Figures</summary>" + "".join(others) + "</details>")
    title = html.escape(content[0].text if isinstance(content[0], Heading) else "")
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>\n"
    )
