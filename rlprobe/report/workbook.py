"""The xlsx workbooks of rlprobe's reports, written straight as SpreadsheetML
(xlsx_cells.py): a workbook whose cell formats are named styles, sheets whose every cell keeps text
as text (rows go in only through Sheet.append and Sheet.append_columns, which store values as
rlprobe.report.safe_cells says), and sheet names that follow Excel's rules.

Sheets are added one after another in tab order, each streamed to a temporary file and then
into the package, so memory stays flat; a sheet's column widths and frozen header are given when
it is added (or by its filler, below). With `background=True` a finished sheet is compressed into
the package by a second thread while the next one is made (zlib and pyarrow.compute release the
GIL). A sheet added with `fill=` is filled by that function: at once, or, with `fillers` > 1, on
one of that many threads while the caller adds the next sheets; the package still takes the sheets
in tab order, and every cell format is registered by the caller (Workbook.style) before it hands
the sheet over, so the workbook is the same part for part whatever the thread count.
Sheet.append_columns writes a whole table of rows with pyarrow.compute (no Python per cell):
openpyxl took 20 s for the 900,000 cells of a 25,600-pair comparison, XlsxWriter 9 s, this about
1 s (docs/reports.md). A cell format is registered once as a named style ("rlprobe bold FFC7CE"
and so on, listed among Excel's cell styles) and cells refer to it by number.
"""

from __future__ import annotations

import datetime
import re
import shutil
import tempfile
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Callable, Sequence

import pyarrow as pa

from rlprobe.report import xlsx_cells
from rlprobe.report.safe_cells import join, write_all, xlsx_cell
from rlprobe.report.xlsx_cells import cell_xml, column_cells, column_letter

# Row fills by status family (the first-divergence row is bold on its own fill) and headers
FILLS = {"bad": "FFC7CE", "missing": "FFEB9C", "first": "FF7C80", "header": "D9D9D9",
         "close": "DDEBF7"}  # close: within rounding, a light blue of its own
MAX_ROWS = 1_048_576  # rows per sheet in Excel
ROWS_PER_CHUNK = 16_384  # rows that Sheet.append_columns turns into text at once
_ZIP64_FROM = 1 << 31  # entries this large need ZIP64 headers (some Excel versions warn about them otherwise)


@dataclass(frozen=True)
class CellFormat:
    bold: bool = False
    fill: str | None = None  # "RRGGBB"
    number_format: str | None = None  # an Excel format code; None = General


Style = int | None  # a cell format as Workbook.style returns it; None (or 0) = the default look


class Workbook:
    """An xlsx workbook written into a binary file object as sheets are added and finished when
    the `with` block ends; after a failure it is closed unfinished (the caller discards the file)."""

    def __init__(self, fileobj: IO[bytes], *, background: bool = False, fillers: int = 1) -> None:
        # deflate level 1: a tenth of the time of the default level for files a quarter larger
        self._zip = zipfile.ZipFile(fileobj, "w", zipfile.ZIP_DEFLATED, allowZip64=True, compresslevel=1)
        self._formats: dict[CellFormat, int] = {CellFormat(): 0}
        self._names: list[str] = []
        self._filters: list[str | None] = []
        self._sheet: Sheet | None = None
        background = background or fillers > 1  # the package takes each sheet once its filler is done
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="rlprobe-xlsx") if background else None
        self._fillers = ThreadPoolExecutor(fillers, thread_name_prefix="rlprobe-xlsx-fill") if fillers > 1 else None
        self._writing: list[Future] = []  # sheets handed to the writer, in tab order
        self._failed = False  # a sheet failed: the writer drops the sheets after it

    def __enter__(self) -> "Workbook":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            self._abandon()
            self._shutdown()
            return
        try:
            if not self._names:  # a workbook has at least one sheet
                self.add_sheet("Sheet")
            self._finish_sheet()
            self._wait_for_writer()
            formats = sorted(self._formats, key=self._formats.__getitem__)
            names = ["Normal"] + [_style_name(f) for f in formats[1:]]
            n = len(self._names)
            now = datetime.datetime.now(tz=datetime.timezone.utc)
            for part, text in (("[Content_Types].xml", xlsx_cells.content_types(n)),
                               ("_rels/.rels", xlsx_cells.package_rels()),
                               ("docProps/app.xml", xlsx_cells.app_xml()),
                               ("docProps/core.xml", xlsx_cells.core_xml(now)),
                               ("xl/workbook.xml", xlsx_cells.workbook_xml(self._names, self._filters)),
                               ("xl/_rels/workbook.xml.rels", xlsx_cells.workbook_rels(n)),
                               ("xl/styles.xml", xlsx_cells.styles_xml(
                                   [(f.bold, f.fill, f.number_format) for f in formats], names))):
                self._zip.writestr(part, text)
            self._zip.close()
        except BaseException:
            self._abandon()
            raise
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        for pool in (self._fillers, self._writer):
            if pool is not None:
                pool.shutdown()

    def _abandon(self) -> None:
        """After a failure: drop the open sheet's temporary file and close the archive, rather than
        leave either half-written to the garbage collector."""
        self._failed = True  # sheets not yet filled are dropped, not filled
        if self._sheet is not None:
            self._sheet.discard()
            self._sheet = None
        try:
            self._wait_for_writer()
        except Exception:  # noqa: BLE001 - the first failure is the one to report
            pass
        try:
            self._zip.close()
        except Exception:  # noqa: BLE001 - the write already failed; that error is the one to report
            pass

    def style(self, fmt: CellFormat) -> int:
        """The cell format that gives a cell `fmt`, registered on first use (as a named style)."""
        if fmt not in self._formats:
            self._formats[fmt] = len(self._formats)
        return 2 * self._formats[fmt]  # 2i + 1 is the same format with Excel's quote prefix

    def add_sheet(self, name: str, widths: Sequence[float] = (), *, freeze: str | None = None,
                  autofilter: str | None = None, fill: Callable[["Sheet"], None] | None = None) -> "Sheet":
        """The next sheet; `name` must already follow Excel's rules (see SheetNames). `freeze`: the
        first cell that scrolls ("A2" freezes the header row); `autofilter`: the range with filter buttons.
        `fill(sheet)`, if given, writes the sheet's rows (and may set its widths), at once or on a filler
        thread; it must not call Workbook.style (register the formats first). Without it the caller
        fills the returned sheet before adding the next one."""
        self._finish_sheet()
        if self._failed:  # a sheet failed on another thread: its error, here
            self._wait_for_writer()
        self._names.append(name)
        self._filters.append(autofilter)
        sheet = Sheet(len(self._names), widths, freeze, autofilter)
        if fill is None:
            self._sheet = sheet
        elif self._fillers is None:
            self._sheet = sheet
            fill(sheet)
        else:
            self._hand_over(sheet, self._fillers.submit(self._filled, sheet, fill))
        return sheet

    def _filled(self, sheet: "Sheet", fill: Callable[["Sheet"], None]) -> None:
        if not self._failed:  # after a failure the sheet is only dropped
            fill(sheet)

    def _finish_sheet(self) -> None:
        if self._sheet is None:
            return
        sheet, self._sheet = self._sheet, None
        if self._writer is None:
            sheet.write_to(self._zip)
            return
        self._hand_over(sheet, None)

    def _hand_over(self, sheet: "Sheet", filling: Future | None) -> None:
        """Queue `sheet` for the writer thread, which puts it into the package once `filling` is done
        (one sheet at a time, in tab order), or drops it after a failure."""
        self._writing.append(self._writer.submit(self._put, sheet, filling))

    def _put(self, sheet: "Sheet", filling: Future | None) -> None:
        """Writer thread: `sheet` into the package once filled; after any failure (its own, or an
        earlier sheet's) only dropped, and the sheets after it too."""
        try:
            if filling is not None:
                filling.result()
            if self._failed:
                raise _Dropped()
            sheet.write_to(self._zip)
        except BaseException:
            self._failed = True
            sheet.discard()
            raise

    def _wait_for_writer(self) -> None:
        """Wait for every sheet handed to the writer; the first error (a sheet's own, not the drop of
        the sheets after it) is raised here."""
        writing, self._writing = self._writing, []
        error: BaseException | None = None
        for future in writing:
            try:
                future.result()
            except _Dropped:
                pass
            except BaseException as exc:  # noqa: BLE001 - the first one is raised below
                error = error or exc
        if error is not None:
            raise error


class _Dropped(Exception):
    """A sheet dropped because an earlier one failed."""


class Sheet:
    """A sheet that takes whole rows only through `append` and `append_columns`, so every cell of
    every rlprobe workbook is stored as safe_cells says: text stays text, never a formula."""

    def __init__(self, number: int, widths: Sequence[float], freeze: str | None, autofilter: str | None) -> None:
        self._number = number
        self._widths = list(widths)
        self._freeze = freeze
        self._autofilter = autofilter
        self._rows = tempfile.TemporaryFile()
        self._row = 0  # the last row written
        self._columns = 0  # the most cells in a row
        self._links: list[tuple[str, str, str]] = []

    def append(self, values: Sequence[Any], styles: Sequence[Style] | Style = None,
               links: dict[int, str] | None = None) -> None:
        """One row: each value as xlsx_cell stores it, styled (one style for the row or one per
        column) and, where `links` names a sheet for the 0-based column, linked to that sheet's A1."""
        if styles is None or isinstance(styles, int):
            styles = [styles] * len(values)
        self._row += 1
        cells = []
        for j, (value, style) in enumerate(zip(values, styles)):
            ref = f"{column_letter(j)}{self._row}"
            cells.append(cell_xml(ref, value, style or 0))
            target = links.get(j) if links else None
            if target is not None:
                self._links.append((ref, f"{xlsx_cells.quoted_sheet(target)}!A1", _display(value)))
        self._columns = max(self._columns, len(cells))
        self._rows.write(f'<row r="{self._row}">{"".join(cells)}</row>'.encode())

    def append_columns(self, columns: Sequence[pa.Array | list[Any]], styles: Sequence[Sequence[Style]],
                       families: pa.Array) -> None:
        """Rows given as columns of equal length (Arrow arrays, or lists of mixed values); row i of
        column j has the style `styles[j][families[i]]` (families: int32, one per row)."""
        n_rows = len(families)
        formats = [[s or 0 for s in column_styles] for column_styles in styles]
        for start in range(0, n_rows, ROWS_PER_CHUNK):
            stop = min(n_rows, start + ROWS_PER_CHUNK)
            # from a range: pa.array of a numpy array imports numpy.ma (~10-15 ms of start-up)
            rows = pa.array(range(self._row + 1 + start, self._row + 1 + stop), pa.int64()).cast(pa.large_string())
            cells = [column_cells(column_letter(j), rows, values[start:stop], fmt, families[start:stop])
                     for j, (values, fmt) in enumerate(zip(columns, formats))]
            write_all(self._rows, join('<row r="', rows, '">', *cells, "</row>"))
        self._row += n_rows
        self._columns = max(self._columns, len(columns))

    def blank_row(self) -> None:
        self._row += 1

    def set_widths(self, widths: Sequence[float]) -> None:
        """The column widths (before the sheet is finished)."""
        self._widths = list(widths)

    def write_to(self, archive: zipfile.ZipFile) -> None:
        """Put the sheet into `archive` as xl/worksheets/sheet<number>.xml."""
        head = xlsx_cells.sheet_start(self._number == 1, xlsx_cells.dimension(self._row, self._columns),
                                      self._widths, self._freeze).encode()
        tail = xlsx_cells.sheet_end(self._autofilter, self._links).encode()
        size = len(head) + self._rows.tell() + len(tail)
        try:
            with archive.open(f"xl/worksheets/sheet{self._number}.xml", "w", force_zip64=size >= _ZIP64_FROM) as part:
                part.write(head)
                self._rows.seek(0)
                shutil.copyfileobj(self._rows, part, 1 << 20)
                part.write(tail)
        finally:
            self.discard()

    def discard(self) -> None:
        self._rows.close()


def quoted_sheet(name: str) -> str:
    return xlsx_cells.quoted_sheet(name)


def _display(value: Any) -> str:
    """A link's text: the cell's text (xlsx_cell has replaced what XML cannot carry)."""
    return str(xlsx_cell(value))


def _style_name(fmt: CellFormat) -> str:
    parts = ["rlprobe"] + ["bold"] * fmt.bold + [fmt.fill or ""] + [fmt.number_format or ""]
    return " ".join(p for p in parts if p)


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
