"""What the xlsx reports need from openpyxl: a write-only workbook whose cell formats are named
styles, sheets whose every cell keeps text as text (rows go in only through Sheet.append, which
stores values as rlprobe.report.safe_cells says), and sheet names that follow Excel's rules.

Write-only mode streams each sheet's rows to a temporary file, so memory stays flat; sheets are
written one after another in tab order, and a sheet's column widths and frozen header must be set
before its first row. A cell format is registered once as a named style ("rlprobe bold FFC7CE"
and so on, listed among Excel's cell styles) and applied by name: setting font, fill and number
format on each cell makes openpyxl hash every style object every time, about 10% slower.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Sequence

import openpyxl
from openpyxl.cell import WriteOnlyCell
from openpyxl.styles import Font, NamedStyle, PatternFill
from openpyxl.utils import get_column_letter
from openpyxl.worksheet.hyperlink import Hyperlink

from rlprobe.report.safe_cells import xlsx_cell, xlsx_quote_prefix

if TYPE_CHECKING:
    from openpyxl.worksheet._write_only import WriteOnlyWorksheet

# Row fills by status family (the first-divergence row is bold on its own fill) and headers
FILLS = {"bad": "FFC7CE", "missing": "FFEB9C", "first": "FF7C80", "header": "D9D9D9"}
MAX_ROWS = 1_048_576  # rows per sheet in Excel


@dataclass(frozen=True)
class CellFormat:
    bold: bool = False
    fill: str | None = None  # "RRGGBB"
    number_format: str | None = None  # an Excel format code; None = General


Style = str | None  # a registered named style; None = the default look


class Workbook:
    """An openpyxl write-only workbook written into a binary file object when the `with` block
    ends; after a failure it is closed without being written (the caller discards the file)."""

    def __init__(self, fileobj: IO[bytes]) -> None:
        self._fileobj = fileobj
        self.book = openpyxl.Workbook(write_only=True)
        self._styles: dict[CellFormat, Style] = {CellFormat(): None}

    def __enter__(self) -> "Workbook":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            self._abandon(None)
            return
        # openpyxl's save_workbook, with the archive in hand: a save that fails (a full disk)
        # must not leave it to the garbage collector, which would print errors at exit
        import datetime

        from openpyxl.writer.excel import ExcelWriter

        if not self.book.worksheets:  # as Workbook.save: a workbook has at least one sheet
            self.book.create_sheet()
        self.book.properties.modified = datetime.datetime.now(tz=datetime.timezone.utc).replace(tzinfo=None)
        archive = zipfile.ZipFile(self._fileobj, "w", zipfile.ZIP_DEFLATED, allowZip64=True)
        try:
            ExcelWriter(self.book, archive).save()
        except BaseException:
            self._abandon(archive)
            raise

    def _abandon(self, archive: zipfile.ZipFile | None) -> None:
        """After a failure: finish each sheet's temporary file now (openpyxl deletes them at exit)
        and close the archive, rather than leave either half-written to the garbage collector."""
        for ws in self.book.worksheets:
            try:
                if not ws.closed:
                    ws.close()
            except Exception:  # noqa: BLE001 - the write already failed; that error is the one to report
                pass
        if archive is not None:
            try:
                archive.close()
            except Exception:  # noqa: BLE001 - as above
                pass

    def style(self, fmt: CellFormat) -> Style:
        """The named style that gives a cell `fmt`, registered on first use."""
        if fmt not in self._styles:
            parts = ["rlprobe"] + ["bold"] * fmt.bold + [fmt.fill or ""] + [fmt.number_format or ""]
            style = NamedStyle(name=" ".join(p for p in parts if p),
                               font=Font(name="Calibri", sz=11, family=2, scheme="minor", b=fmt.bold),
                               number_format=fmt.number_format or "General")
            if fmt.fill:
                style.fill = PatternFill("solid", fgColor="FF" + fmt.fill)
            self.book.add_named_style(style)
            self._styles[fmt] = style.name
        return self._styles[fmt]

    def add_sheet(self, name: str, widths: Sequence[float] = (), *, freeze: str | None = None,
                  autofilter: str | None = None) -> "Sheet":
        """The next sheet; `name` must already follow Excel's rules (see SheetNames). `freeze`: the
        first cell that scrolls ("A2" freezes the header row); `autofilter`: the range with filter buttons."""
        ws = self.book.create_sheet(name)
        for i, width in enumerate(widths, 1):
            ws.column_dimensions[get_column_letter(i)].width = round(width, 2)
        if freeze:
            ws.freeze_panes = freeze
        if autofilter:
            ws.auto_filter.ref = autofilter
        return Sheet(ws)


class Sheet:
    """A write-only sheet that takes whole rows only through `append`, so every cell of every
    rlprobe workbook is stored as safe_cells says: text stays text, never a formula."""

    def __init__(self, ws: "WriteOnlyWorksheet") -> None:
        self._ws = ws

    def append(self, values: Sequence[Any], styles: Sequence[Style] | Style = None,
               links: dict[int, str] | None = None) -> None:
        """One row: each value as xlsx_cell stores it, styled (one style for the row or one per
        column) and, where `links` names a sheet for the 0-based column, linked to that sheet's A1."""
        if styles is None or isinstance(styles, str):
            styles = [styles] * len(values)
        ws = self._ws
        row = []
        for j, (value, style) in enumerate(zip(values, styles)):
            value = xlsx_cell(value)
            target = links.get(j) if links else None
            quoted = xlsx_quote_prefix(value)
            if style is None and target is None and not quoted:
                row.append(value)  # openpyxl writes plain values without a cell object of their own
                continue
            cell = WriteOnlyCell(ws, value)
            if type(value) is str:
                cell.data_type = "s"  # never a formula, whatever the text starts with
            if style is not None:
                cell.style = style
            if quoted:
                cell.quotePrefix = True  # set after the named style, which would reset it
            if target is not None:
                cell.hyperlink = Hyperlink(ref="", location=f"{quoted_sheet(target)}!A1", display=str(value))
            row.append(cell)
        ws.append(row)

    def blank_row(self) -> None:
        self._ws.append([])


def quoted_sheet(name: str) -> str:
    return "'" + name.replace("'", "''") + "'"


class SheetNames:
    """Names that follow Excel's rules: at most 31 characters, none of []:*?/\\, no leading or
    trailing apostrophe, not 'History', unique regardless of case."""

    MAX_LEN = 31
    _FORBIDDEN = re.compile(r"[\[\]:*?/\\\x00-\x1f]")

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def claim(self, wanted: str) -> str:
        base = self._FORBIDDEN.sub("_", wanted).strip("'").strip() or "sheet"
        if base.casefold() == "history":  # reserved by Excel
            base = "History_"
        base = base[: self.MAX_LEN]
        name, n = base, 1
        while name.casefold() in self._taken:
            n += 1
            suffix = f" ({n})"
            name = base[: self.MAX_LEN - len(suffix)].rstrip("'") + suffix
        self._taken.add(name.casefold())
        return name
