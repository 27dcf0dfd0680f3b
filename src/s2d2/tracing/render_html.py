"""The trace as one self-contained HTML page: inline CSS and JS, no network, no external scripts.

The page lists every step of every block (the block's tokens as they stand after the step, coloured by how
they were committed), a slider that steps through the decode (later steps are hidden, the current one is
highlighted and described), and, on hover, each token's draft confidence and verifier probability.

Markup the tests rely on: each token a step commits is one ``span.tok`` with ``data-how`` (so the page
holds exactly one such element per commit of the trace); tokens committed earlier are ``span.old``,
prompt tokens ``span.prompt``, masked positions ``span.mask``; each step is a ``div.step`` with
``data-index``; the slider is ``input#step-slider`` and its description ``#step-label``.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

from .view import KINDS, Cell, StepView, TraceView

#: Colour of each commit kind (the same hues as the terminal view).
COLOURS: dict[str, str] = {
    "accepted": "#2e9d3a",
    "predraft": "#7fc97f",
    "resampled": "#d62728",
    "ar": "#1aa3b8",
    "fallback": "#c99a00",
    "baseline": "#1f5fbf",
    "edited": "#b03ab0",
}

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em} .muted{color:#777}
.legend span.key{display:inline-block;margin-right:1em}
.sw{display:inline-block;width:.9em;height:.9em;border-radius:2px;vertical-align:middle;margin-right:.3em}
.controls{position:sticky;top:0;background:#fafafa;padding:.5em 0;border-bottom:1px solid #ddd;z-index:2}
#step-slider{width:60%;vertical-align:middle} #step-label{margin-left:1em;font-weight:600}
#info{min-height:1.4em;font-family:monospace;color:#333;margin-top:.3em}
.block{margin:.8em 0} .block h3{font-size:1em;margin:.3em 0}
.step{font-family:monospace;padding:2px 4px;border-left:3px solid transparent;white-space:nowrap}
.step.current{background:#fff6d5;border-left-color:#e0a800} .step.future{display:none}
.meta{display:inline-block;min-width:30em;margin-right:.5em;color:#555}
.step span.c{display:inline-block;padding:0 3px;margin:0 1px;border-radius:3px}
.tok{color:#fff;font-weight:700} .old{opacity:.55;color:#fff} .prompt{color:#888;background:#eee}
.mask{color:#bbb;background:#f0f0f0} .c:hover{outline:2px solid #333}
table.summary{border-collapse:collapse;margin-top:1em} table.summary td{border:1px solid #ddd;padding:2px 8px}
"""

_JS = """
(function(){
  var slider=document.getElementById('step-slider'), label=document.getElementById('step-label');
  var steps=Array.prototype.slice.call(document.querySelectorAll('div.step'));
  var blocks=Array.prototype.slice.call(document.querySelectorAll('div.block'));
  function show(k){
    steps.forEach(function(el){
      var i=+el.dataset.index;
      el.classList.toggle('future', i>k); el.classList.toggle('current', i===k);
    });
    blocks.forEach(function(b){ b.style.display = (+b.dataset.first<=k) ? '' : 'none'; });
    var cur=steps[k];
    if(cur){ label.textContent='step '+(k+1)+'/'+steps.length+' \\u00b7 block '+cur.dataset.block+' step '+
      cur.dataset.step+' \\u00b7 '+cur.dataset.kind+' \\u00b7 NFE '+cur.dataset.nfe+' \\u00b7 committed '+
      cur.querySelectorAll('.tok').length; }
  }
  slider.addEventListener('input', function(){ show(+slider.value); });
  document.addEventListener('keydown', function(e){
    if(e.key==='ArrowRight'||e.key==='ArrowLeft'){
      var v=+slider.value+(e.key==='ArrowRight'?1:-1); v=Math.max(0,Math.min(+slider.max,v));
      slider.value=v; show(v);
    }
  });
  var info=document.getElementById('info');
  document.addEventListener('mouseover', function(e){
    var t=e.target; if(!t.classList||!t.classList.contains('c')) return;
    info.textContent=t.getAttribute('title');
  });
  show(+slider.value);
})();
"""


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _cell(c: Cell) -> str:
    cls = "tok" if c.new else ("old" if c.kind in COLOURS else c.kind)
    style = f' style="background:{COLOURS[c.kind]}"' if c.kind in COLOURS else ""
    title = f"position {c.position} · {c.kind}"
    if c.token is not None:
        title += f" · token {c.text!r} (id {c.token})"
    if c.kind in COLOURS:
        title += f" · draft confidence {_fmt(c.confidence)} · verifier probability {_fmt(c.q_prob)}"
    attrs = f' data-how="{c.kind}" data-pos="{c.position}"'
    if c.kind in COLOURS:
        attrs += f' data-conf="{_fmt(c.confidence)}" data-q="{_fmt(c.q_prob)}"'
    return (
        f'<span class="c {cls}"{style}{attrs} title="{html.escape(title, quote=True)}">'
        f"{html.escape(c.text)}</span>"
    )


def _step(s: StepView) -> str:
    meta = f"step {s.step} · {s.kind} · NFE {s.nfe}" + (
        f" · accepted {s.accepted}/{s.span}" if s.verified else ""
    ) + (f" · {s.plan}" if s.plan else "")
    return (
        f'<div class="step" data-index="{s.index}" data-block="{s.block_index}" data-step="{s.step}" '
        f'data-kind="{s.kind}" data-nfe="{s.nfe}"><span class="meta">{html.escape(meta)}</span>'
        + "".join(_cell(c) for c in s.cells)
        + "</div>"
    )


def _blocks(view: TraceView) -> str:
    out, current = [], None
    for s in view.steps:
        if s.block_index != current:
            if current is not None:
                out.append("</div>")
            current = s.block_index
            out.append(
                f'<div class="block" data-block="{current}" data-first="{s.index}">'
                f"<h3>block {current} <span class='muted'>(positions from {s.block_start})</span></h3>"
            )
        out.append(_step(s))
    if current is not None:
        out.append("</div>")
    return "\n".join(out)


def _legend() -> str:
    keys = "".join(
        f'<span class="key"><span class="sw" style="background:{COLOURS[k]}"></span><b>{k}</b>: '
        f"{html.escape(v)}</span>"
        for k, v in KINDS.items()
    )
    return (
        f'<div class="legend">{keys}<span class="key muted">faded = committed in an earlier step</span></div>'
    )


def _summary(view: TraceView) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(str(k).replace('_', ' '))}</td><td>{html.escape(json.dumps(v))}</td></tr>"
        for k, v in view.summary.items()
    )
    return f'<table class="summary">{rows}</table>'


def render_html(view: TraceView, title: str = "s2d2 decode trace") -> str:
    """The whole page as a string."""
    n = len(view.steps)
    text = ""
    if view.prompt_text:
        text += f"<p><b>prompt:</b> {html.escape(view.prompt_text)}</p>"
    if view.output_text:
        text += f"<p><b>output:</b> {html.escape(view.output_text)}</p>"
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{text}{_legend()}"
        f"<div class='controls'><input type='range' id='step-slider' min='0' max='{max(n - 1, 0)}' "
        f"value='{max(n - 1, 0)}' step='1' aria-label='decoding step'><span id='step-label'></span>"
        "<div id='info' class='muted'>hover a token for its draft confidence and verifier probability</div>"
        f"</div><div id='steps'>{_blocks(view)}</div>{_summary(view)}"
        f"<script>{_JS}</script></body></html>\n"
    )


def write_html(view: TraceView, path: str | os.PathLike[str], title: str = "s2d2 decode trace") -> Path:
    """Write the page to ``path``; returns it."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_html(view, title), encoding="utf-8")
    return p


__all__ = ["COLOURS", "render_html", "write_html"]
