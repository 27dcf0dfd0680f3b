"""The trace in a terminal (rich): each step of each block, tokens coloured by how they were committed."""

from __future__ import annotations

from typing import Any

from .view import KINDS, StepView, TraceView

#: rich colour of each commit kind (the HTML view uses the same hues).
STYLES: dict[str, str] = {
    "accepted": "green",
    "predraft": "bright_green",
    "resampled": "red",
    "ar": "cyan",
    "fallback": "yellow",
    "baseline": "blue",
    "edited": "magenta",
    "prompt": "grey50",
    "mask": "grey35",
}


def _step_line(s: StepView) -> Any:
    from rich.text import Text

    line = Text()
    head = f"  step {s.step:<3d} {s.kind:<14s} NFE {s.nfe:<5d} "
    line.append(head, style="bold" if s.verified else "")
    line.append("| ")
    for i, c in enumerate(s.cells):
        if i:
            line.append(" ")
        style = STYLES.get(c.kind, "white")
        if c.new:
            style = f"bold {style} underline"
        elif c.kind not in ("prompt", "mask"):
            style = f"dim {style}"
        line.append(c.text, style=style)
    if s.verified:
        line.append(f"   (verified {s.span}, accepted {s.accepted})", style="grey50")
    if s.plan:
        line.append(f"   [{s.plan}]", style="grey50")
    return line


def _legend() -> Any:
    from rich.text import Text

    text = Text("legend: ")
    for kind, meaning in KINDS.items():
        text.append(kind, style=f"bold {STYLES[kind]}")
        text.append(f" = {meaning};  ")
    text.append("· = masked; underlined = committed in this step", style="grey50")
    return text


def _summary_table(view: TraceView) -> Any:
    from rich.table import Table

    table = Table(title="summary", show_header=True, header_style="bold")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for key, value in view.summary.items():
        if key == "commits":
            continue
        table.add_row(key.replace("_", " "), "-" if value is None else str(value))
    for kind in KINDS:
        if view.counts.get(kind):
            table.add_row(f"commits: {kind}", str(view.counts[kind]), style=STYLES[kind])
    return table


def print_trace(view: TraceView, console: Any = None) -> None:
    """Draw ``view`` on ``console`` (a :class:`rich.console.Console`; default: stdout)."""
    from rich.console import Console

    console = console or Console()
    from rich.text import Text

    if view.prompt_text:
        console.print(Text.assemble(("prompt: ", "bold"), view.prompt_text))
    console.print(_legend())
    block = None
    for s in view.steps:
        if s.block_index != block:
            block = s.block_index
            console.print(Text.assemble((f"block {block}", "bold"), f" (positions from {s.block_start})"))
        console.print(_step_line(s), highlight=False)
    if view.output_text:
        console.print(Text.assemble(("output: ", "bold"), view.output_text))
    console.print(_summary_table(view))


def render_text(view: TraceView, width: int = 140) -> str:
    """The terminal view as plain text (colours dropped), e.g. for tests and logs."""
    from rich.console import Console

    console = Console(record=True, width=width, file=_Null(), color_system=None, force_terminal=False)
    print_trace(view, console)
    return console.export_text()


class _Null:
    """A file that swallows writes (the recording console keeps the text)."""

    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass


__all__ = ["STYLES", "print_trace", "render_text"]
