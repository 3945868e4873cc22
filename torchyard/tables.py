"""List tables of the CLI that fit the terminal without cutting what a user copies.

Every list command (`jobs`, `datasets list`, `keys list`, `evals`, ...) prints a `ListTable`.
Its columns say what their values are, and that decides what happens on a narrow terminal:

- ``id`` and ``num``: shown whole, never cut: ids (what the next command takes), states,
  short labels, numbers (``num`` is right-aligned);
- ``name``: cut in the middle with an ellipsis (``quick…start-7``), never wrapped;
- ``text``: cut at the end with an ellipsis, unless it has a `drop` rank: then whole or
  dropped;
- ``long``: a path or other value that must stay whole (a checkpoint's uri, an evaluation's
  scores): a column while the table fits, else printed whole on its own line under its row.

When the table does not fit, columns with a `drop` rank go first (1 before 2, ...), then names
and texts shrink to their minimum widths. Every row stays one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

Kind = Literal["id", "num", "name", "text", "long"]
Cell = str | Text

NAME_MIN = 16  # a name cut to this many cells still tells its neighbours apart
TEXT_MIN = 10
GAP = 2  # cells between two columns


@dataclass(frozen=True)
class Column:
    """One column: its header, what its values are (`Kind`), and when it is dropped on a
    narrow terminal (`drop`: 1 first, then 2, ...; None: never)."""

    header: str
    kind: Kind = "text"
    drop: int | None = None
    footer: str = ""


def cut_middle(text: Text, width: int) -> Text:
    """`text` in at most `width` cells: its start and end around an ellipsis (``quick…rt-7``)."""
    if cell_len(text.plain) <= width:
        return text
    keep = max(width - 1, 0)
    head, tail = (keep + 1) // 2, keep // 2
    return text[:head] + Text("…") + (text[len(text) - tail :] if tail else Text())


class ListTable:
    """A table of rows with one line each, fitted to the console's width when printed (see
    the module's docstring); `add_row` takes a `str` or `Text` per column, strings never read
    as markup."""

    def __init__(self, *columns: Column) -> None:
        self.columns = columns
        self.rows: list[list[Text]] = []

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([_one_line(cell) for cell in cells])

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown, widths = self._fit(options.max_width)
        below = [i for i, c in enumerate(self.columns) if c.kind == "long" and i not in shown]
        table = self._table(shown, widths)
        # At the table's own width: wider than the terminal only when its ids alone are, and
        # then a row runs past the edge rather than cutting them.
        width = _total(widths.values())
        lines = console.render_lines(table, options.update(width=width), pad=False)
        yield from _lines(lines[:1])
        for row, line in zip(self.rows, lines[1:], strict=False):
            yield from _lines([line])
            for i in below:
                if row[i].plain not in ("", "-"):
                    # Whole on one line: never wrapped, never cut (the CLI's consoles soft-wrap).
                    yield WholeLine(Text("  ").append_text(row[i]))
        yield from _lines(lines[1 + len(self.rows) :])  # the footer, if any

    def _natural(self, i: int) -> int:
        column = self.columns[i]
        return max(
            cell_len(column.header),
            cell_len(column.footer),
            *(cell_len(row[i].plain) for row in self.rows),
        )

    def _minimum(self, i: int) -> int:
        """A name's or an undroppable text's narrowest cut; any other column is whole."""
        column, natural = self.columns[i], self._natural(i)
        floor = NAME_MIN if column.kind == "name" else TEXT_MIN
        if column.kind == "name" or (column.kind == "text" and column.drop is None):
            return min(natural, max(floor, cell_len(column.header)))
        return natural

    def _fit(self, width: int) -> tuple[list[int], dict[int, int]]:
        """The columns shown and their widths: long values leave the table unless all fits
        whole, then columns are dropped by rank while even the narrowest layout is too wide;
        the width left is shared, a cell at a time, by the names and texts that are cut."""
        shown = list(range(len(self.columns)))
        if _total(self._natural(i) for i in shown) > width:
            shown = [i for i in shown if self.columns[i].kind != "long"]
        droppable = sorted(
            (c.drop, i) for i, c in enumerate(self.columns) if c.drop is not None and i in shown
        )
        while droppable and _total(self._minimum(i) for i in shown) > width:
            shown.remove(droppable.pop(0)[1])
        widths = {i: self._minimum(i) for i in shown}
        spare = width - _total(widths.values())
        growing = [i for i in shown if widths[i] < self._natural(i)]
        while spare > 0 and growing:  # a cell at a time to each, so all cut ones share it
            for i in growing[:spare]:
                widths[i] += 1
                spare -= 1
            growing = [i for i in growing if widths[i] < self._natural(i)]
        return shown, widths

    def _table(self, shown: list[int], widths: dict[int, int]) -> Table:
        footer = any(c.footer for c in self.columns)
        table = Table(
            box=None, header_style="bold", pad_edge=False, padding=(0, 1), show_footer=footer
        )
        for i in shown:
            column = self.columns[i]
            table.add_column(
                column.header,
                footer=column.footer,
                justify="right" if column.kind == "num" else "left",
                width=widths[i],
                no_wrap=True,
                overflow="ellipsis",
            )
        for row in self.rows:
            table.add_row(*(self._cell(row[i], i, widths[i]) for i in shown))
        return table

    def _cell(self, cell: Text, i: int, width: int) -> Text:
        return cut_middle(cell, width) if self.columns[i].kind == "name" else cell


class WholeLine:
    """`text` on one line of its own, never wrapped nor cut by rich (on the CLI's soft-wrapping
    consoles): a path a user copies, whatever the terminal's width."""

    def __init__(self, text: Text) -> None:
        self.text = _one_line(text)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.text.render(console)
        yield Segment.line()


def _one_line(cell: Cell) -> Text:
    text = Text(cell) if isinstance(cell, str) else cell
    return Text(" ").join(text.split("\n")) if "\n" in text.plain else text


def _total(widths: Iterable[int]) -> int:
    sizes = list(widths)
    return sum(sizes) + GAP * max(len(sizes) - 1, 0)


def _lines(lines: list[list[Segment]]) -> Iterator[Segment]:
    for line in lines:
        yield from line
        yield Segment.line()
