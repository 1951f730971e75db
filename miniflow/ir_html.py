"""The IR as HTML: what ``print(graph)`` shows, for a Jupyter notebook (``Graph._repr_html_``,
IPython's rich display protocol), each node line filled with its AMP color.

The colors are :meth:`miniflow.ir.Graph.to_dot`'s (white = float16, black, gray, clear = light
blue, unlisted = khaki, inserted cast = gold, no AMP color = lavender); a ``cast`` node is marked
``CAST``, an identity (``amp_white_identity``, ``amp_black_identity``, ``identity``) ``ID``, and
a legend lists the colors the graph uses. Every name and attribute is HTML-escaped.

Source: IPython's display protocol (``IPython.core.formatters``: ``_repr_html_``), as pandas'
``DataFrame._repr_html_``.
"""
from __future__ import annotations

import html

__all__ = ["graph_html", "CSS_COLORS"]

CSS_COLORS = {"white": ("#ffffff", "#000000"), "black": ("#000000", "#ffffff"),
              "gray": ("#b3b3b3", "#000000"), "clear": ("#add8e6", "#000000"),
              "unlisted": ("#f0e68c", "#000000"), "cast": ("#ffd700", "#000000"),
              None: ("#e6e6fa", "#000000")}
"""AMP color -> (background, text) in CSS: the fills of ``Graph.to_dot`` (Graphviz's gray70,
lightblue, khaki, gold, lavender)."""

_LEGEND = {"white": "white: float16", "black": "black: float32", "gray": "gray: follows its "
           "inputs", "clear": "clear: follows its inputs", "unlisted": "unlisted: float32",
           "cast": "cast inserted by AMP", None: "no AMP color"}


def _mark(node) -> str:
    """``CAST`` for a cast, ``ID`` for an identity op, else empty."""
    if node.op.name == "cast":
        return "CAST"
    return "ID" if node.op.name.endswith("identity") else ""


def graph_html(graph) -> str:
    """``graph`` (a :class:`miniflow.ir.Graph`) as an HTML fragment: the printed header, one
    colored line per node (``data-amp-color`` holds its color, ``none`` without one), the return
    line and the other results, then a legend of the colors used."""
    lines = str(graph).split("\n")
    first = lines.index(") {") + 1          # the node lines follow the header
    style = ("font-family:monospace;font-size:12px;white-space:pre;margin:0;padding:1px 4px;"
             "border-left:4px solid {border}")
    out = ['<div class="miniflow-ir">']
    for text in lines[:first]:
        out.append(f'<div style="{style.format(border="transparent")}">{html.escape(text)}</div>')
    used = []
    for node, text in zip(graph.nodes, lines[first:first + len(graph.nodes)]):
        color = node.meta.get("amp_color")
        if color not in used:
            used.append(color)
        bg, fg = CSS_COLORS[color]
        mark = _mark(node)
        badge = (f' <b style="background:#c00;color:#fff;padding:0 3px">{mark}</b>'
                 if mark else "")
        out.append(f'<div data-amp-color="{color or "none"}" data-op="{html.escape(node.op.name)}"'
                   f' style="{style.format(border="#c00" if mark else "#999")};background:{bg};'
                   f'color:{fg}">{html.escape(text)}{badge}</div>')
    for text in lines[first + len(graph.nodes):]:
        out.append(f'<div style="{style.format(border="transparent")}">{html.escape(text)}</div>')
    legend = " ".join(f'<span style="background:{CSS_COLORS[c][0]};color:{CSS_COLORS[c][1]};'
                      f'border:1px solid #999;padding:0 4px">{html.escape(_LEGEND[c])}</span>'
                      for c in used)
    out.append(f'<div style="font-size:11px;margin-top:4px">{legend} &nbsp;'
               '<b style="background:#c00;color:#fff;padding:0 3px">CAST</b> cast node '
               '<b style="background:#c00;color:#fff;padding:0 3px">ID</b> identity</div>')
    out.append("</div>")
    return "\n".join(out)
