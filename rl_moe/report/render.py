"""A tiny document model (headings, paragraphs, tables, images) rendered to Markdown and HTML."""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class Heading:
    """A section title; ``level`` 1..4."""

    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    """Plain text (no markup)."""

    text: str


@dataclass(frozen=True)
class Table:
    """A table of preformatted cells with an optional caption (the first column is the row label)."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


@dataclass(frozen=True)
class Image:
    """A figure file (relative to the report) with a caption."""

    path: str
    caption: str


Block = Heading | Paragraph | Table | Image


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(blocks: list[Block]) -> str:
    """Render blocks as GitHub-flavoured Markdown."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"{'#' * b.level} {b.text}")
        elif isinstance(b, Paragraph):
            out.append(b.text)
        elif isinstance(b, Table):
            lines = [f"*{b.caption}*", ""] if b.caption else []
            lines.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
            lines.append("|" + "|".join(["---"] + ["---:"] * (len(b.header) - 1)) + "|")
            lines.extend("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows)
            out.append("\n".join(lines))
        elif isinstance(b, Image):
            out.append(f"![{b.caption}]({b.path})\n\n*{b.caption}*")
    return "\n\n".join(out) + "\n"


_CSS = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border:1px solid #bbb;padding:3px 8px;text-align:right}"
    "th:first-child,td:first-child{text-align:left}caption{caption-side:top;text-align:left;font-style:italic;padding:4px 0}"
    "figure{margin:1em 0}img{max-width:100%}figcaption{font-style:italic;color:#555}"
)


def to_html(blocks: list[Block], title: str) -> str:
    """Render blocks as a standalone HTML page (figures linked by relative path)."""
    e = html.escape
    body: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{e(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            body.append(f"<p>{e(b.text)}</p>")
        elif isinstance(b, Table):
            cap = f"<caption>{e(b.caption)}</caption>" if b.caption else ""
            head = "".join(f"<th>{e(h)}</th>" for h in b.header)
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in b.rows)
            body.append(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(b, Image):
            body.append(f'<figure><img src="{e(b.path)}" alt="{e(b.caption)}"><figcaption>{e(b.caption)}</figcaption></figure>')
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{e(title)}</title><style>{_CSS}</style></head>\n'
        f"<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
