"""An xlsx package (ECMA-376 SpreadsheetML) as text: its cells and the fixed parts around its sheets.

Cells of rlprobe's xlsx sheets are stored as rlprobe.report.safe_cells says: one value at a time (`cell_xml`,
for small sheets) or a whole Arrow column at a time (`column_cells`: pyarrow.compute builds every cell's text,
no Python per cell; docs/reports.md). Text is an inline string (`t="inlineStr"`, never a formula: no cell is
ever written with `<f>`), quote-prefixed where xlsx_quote_prefix says so through the cell format's quoted twin,
the xf index right after it (see workbook.py); an empty string is an empty cell, as openpyxl wrote it. Numbers
are their shortest round-trip text; booleans `t="b"`.

The fixed parts workbook.py writes around its sheets: content types, relationships, workbook.xml with the sheet
list and autofilter names, styles.xml with rlprobe's cell formats as named styles, document properties, and a
sheet's XML before and after its rows. Only what rlprobe's reports use: no theme, no shared strings (cells
hold inline strings), no formulas.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.report.comparison_words import list_texts
from rlprobe.report.safe_cells import (MAX_CELL_CHARS, NOTHING, join, literal, xlsx_cell,
                                       xlsx_quote_prefix, xlsx_text)

_EXACT_INT = 2**53  # as safe_cells: larger integers are stored as text
_NEEDS_FIXING = "[\x00-\x08\x0b\x0c\x0e-\x1f\r\ufffe\uffff]"  # what xlsx_text replaces (and CR)
_XML_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ESCAPE = re.compile("[&<>]")
_FORMULA_START = "^[=+@\t-]"  # FORMULA_TRIGGERS less CR, which never remains (xlsx_text)
_TEXT_OPEN = ' t="inlineStr"><is><t xml:space="preserve">'
_TEXT_CLOSE = "</t></is></c>"
_NO_TEXT = pa.scalar(None, pa.large_string())


def column_letter(j: int) -> str:
    """The letter(s) of the 0-based column `j`: A, ..., Z, AA, ..."""
    letters = ""
    j += 1
    while j:
        j, r = divmod(j - 1, 26)
        letters = chr(65 + r) + letters
    return letters


def escape_xml(text: str) -> str:
    """Text for an XML text node or a double-quoted attribute value."""
    return _ESCAPE.sub(_entity, text).replace('"', "&quot;")


def _entity(match: re.Match[str]) -> str:
    return _XML_ESCAPES[match.group()]


def cell_xml(ref: str, value: Any, style: int) -> str:
    """One cell as xlsx_cell stores `value`, with the cell format `style` (0: the default look);
    "" for an empty cell of the default look, which needs no element."""
    stored = xlsx_cell(value)
    if stored is None or stored == "":
        return f'<c r="{ref}" s="{style}"/>' if style else ""
    if type(stored) is str:
        if xlsx_quote_prefix(stored):
            style += 1
        s = f' s="{style}"' if style else ""
        return f'<c r="{ref}"{s}{_TEXT_OPEN}{_ESCAPE.sub(_entity, stored)}{_TEXT_CLOSE}'
    s = f' s="{style}"' if style else ""
    if type(stored) is bool:
        return f'<c r="{ref}"{s} t="b"><v>{int(stored)}</v></c>'
    return f'<c r="{ref}"{s}><v>{stored!r}</v></c>'


def column_cells(letter: str, rows: pa.Array, values: pa.Array | list[Any], formats: Sequence[int],
                 families: pa.Array) -> pa.Array:
    """Each row's cell of one column, as large_string ("" for an empty cell of the default look).
    `rows`: the row numbers as text; row i has the cell format `formats[families[i]]` (0: the
    default look); `values`: an Arrow array, or a Python list (cells of mixed types) written one
    value at a time."""
    if isinstance(values, list) or not _vectorized(values.type):
        items = values if isinstance(values, list) else values.to_pylist()
        return pa.array([cell_xml(f"{letter}{r}", v, formats[f]) for r, v, f in
                         zip(rows.to_pylist(), items, families.to_pylist())], pa.large_string())
    number, text, flag = _split(values)
    attr = _per_family([f' s="{s}"' if s else "" for s in formats], families)
    cells = []
    if _any(number):
        cells.append(join('<c r="', letter, rows, '"', attr, "><v>", number, "</v></c>"))
    if _any(text):
        quoted = _per_family([f' s="{s + 1}"' for s in formats], families)
        attr_text = pc.if_else(pc.fill_null(_formula_like(text), False), quoted, attr)
        cells.append(join('<c r="', letter, rows, '"', attr_text, _TEXT_OPEN, _escaped(text), _TEXT_CLOSE))
    if _any(flag):
        bit = pc.if_else(flag, literal("1"), literal("0"))
        cells.append(join('<c r="', letter, rows, '"', attr, ' t="b"><v>', bit, "</v></c>"))
    cells = pc.coalesce(*cells) if len(cells) > 1 else cells[0] if cells else pa.nulls(len(rows), pa.large_string())
    if not cells.null_count:
        return cells
    if not any(formats):  # empty cells of the default look need no element
        return pc.fill_null(cells, NOTHING)
    empty = join('<c r="', letter, rows, '"', attr, "/>")
    return pc.coalesce(cells, pc.if_else(pc.equal(attr, ""), NOTHING, empty))


def _per_family(texts: Sequence[str], families: pa.Array) -> pa.Array:
    return pc.take(pa.array(texts, pa.large_string()), families)


def _any(values: pa.Array | None) -> bool:
    return values is not None and values.null_count < len(values)


def _vectorized(t: pa.DataType) -> bool:
    return (pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t)
            or pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _split(values: pa.Array) -> tuple[pa.Array | None, pa.Array | None, pa.Array | None]:
    """(number text, stored text, booleans): each null where the row holds something else or nothing."""
    t = values.type
    if pa.types.is_dictionary(t):
        values, t = values.cast(t.value_type), t.value_type
    if pa.types.is_null(t):
        return None, None, None
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        values, t = list_texts(values), None
    if t is None or pa.types.is_string(t) or pa.types.is_large_string(t):
        text = values.cast(pa.large_string())
        if text.offset:  # a slice (a chunk of a sheet): pyarrow < 24's if_else with a null garbles its text
            text = pa.concat_arrays([text])
        return None, _stored_text(pc.if_else(pc.equal(text, ""), _NO_TEXT, text)), None
    if pa.types.is_boolean(t):
        return None, None, values
    if pa.types.is_floating(t):
        values = values.cast(pa.float64())  # a float32 is stored as the double Python reads, as before
        as_text = values.cast(pa.large_string())  # shortest round-trip; nan, inf, -inf as Python writes them
        finite = pc.is_finite(values)
        return pc.if_else(finite, as_text, _NO_TEXT), pc.if_else(finite, _NO_TEXT, as_text), None
    if pa.types.is_unsigned_integer(t):
        values = values.cast(pa.uint64())
        exact = pc.less_equal(values, pa.scalar(_EXACT_INT, pa.uint64()))
    else:
        values = values.cast(pa.int64())
        exact = pc.and_(pc.less_equal(values, _EXACT_INT), pc.greater_equal(values, -_EXACT_INT))
    as_text = values.cast(pa.large_string())
    return pc.if_else(exact, as_text, _NO_TEXT), pc.if_else(exact, _NO_TEXT, as_text), None


def _stored_text(text: pa.Array) -> pa.Array:
    """`text` as xlsx_text stores it: rows with over-long text, CR or characters XML cannot carry
    go through xlsx_text itself (rare); the rest unchanged."""
    odd = pc.or_(pc.match_substring_regex(text, _NEEDS_FIXING), pc.greater(pc.utf8_length(text), MAX_CELL_CHARS))
    if not pc.any(pc.fill_null(odd, False)).as_py():
        return text
    fixed = [v if v is None or not o else xlsx_text(v) for v, o in zip(text.to_pylist(), odd.to_pylist())]
    return pa.array(fixed, pa.large_string())


def _formula_like(text: pa.Array) -> pa.Array:
    """xlsx_quote_prefix of each row."""
    return pc.match_substring_regex(text, _FORMULA_START)


def _escaped(text: pa.Array) -> pa.Array:
    for ch, entity in _XML_ESCAPES.items():
        text = pc.replace_substring(text, ch, entity)  # "&" first: the entities hold one
    return text


MAIN_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
REL_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
PKG_REL_NS = "http://schemas.openxmlformats.org/package/2006/relationships"
_DOC_TYPE = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_CT = "application/vnd.openxmlformats-officedocument"
HEAD = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
GENERAL = "General"


def content_types(n_sheets: int) -> str:
    sheets = "".join(f'<Override PartName="/xl/worksheets/sheet{i}.xml" '
                     f'ContentType="{_CT}.spreadsheetml.worksheet+xml"/>' for i in range(1, n_sheets + 1))
    return (HEAD + '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            f'<Override PartName="/xl/workbook.xml" ContentType="{_CT}.spreadsheetml.sheet.main+xml"/>'
            f'<Override PartName="/xl/styles.xml" ContentType="{_CT}.spreadsheetml.styles+xml"/>{sheets}'
            '<Override PartName="/docProps/core.xml" '
            'ContentType="application/vnd.openxmlformats-package.core-properties+xml"/>'
            f'<Override PartName="/docProps/app.xml" ContentType="{_CT}.extended-properties+xml"/></Types>')


def package_rels() -> str:
    return (HEAD + f'<Relationships xmlns="{PKG_REL_NS}">'
            f'<Relationship Id="rId1" Type="{_DOC_TYPE}/officeDocument" Target="xl/workbook.xml"/>'
            '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/package/2006/relationships/metadata/'
            'core-properties" Target="docProps/core.xml"/>'
            f'<Relationship Id="rId3" Type="{_DOC_TYPE}/extended-properties" Target="docProps/app.xml"/>'
            '</Relationships>')


def workbook_rels(n_sheets: int) -> str:
    sheets = "".join(f'<Relationship Id="rId{i}" Type="{_DOC_TYPE}/worksheet" Target="worksheets/sheet{i}.xml"/>'
                     for i in range(1, n_sheets + 1))
    return (HEAD + f'<Relationships xmlns="{PKG_REL_NS}">{sheets}'
            f'<Relationship Id="rId{n_sheets + 1}" Type="{_DOC_TYPE}/styles" Target="styles.xml"/></Relationships>')


def workbook_xml(names: Sequence[str], filters: Sequence[str | None]) -> str:
    """The sheet list; `filters[i]`: sheet i's autofilter range, named as Excel names it."""
    sheets = "".join(f'<sheet name="{escape_xml(n)}" sheetId="{i}" r:id="rId{i}"/>' for i, n in enumerate(names, 1))
    defined = "".join(f'<definedName name="_xlnm._FilterDatabase" localSheetId="{i}" hidden="1">'
                      f"{escape_xml(quoted_sheet(names[i]))}!{absolute_range(ref)}</definedName>"
                      for i, ref in enumerate(filters) if ref)
    return (HEAD + f'<workbook xmlns="{MAIN_NS}" xmlns:r="{REL_NS}"><workbookPr/>'
            '<bookViews><workbookView activeTab="0"/></bookViews>'
            f"<sheets>{sheets}</sheets>" + (f"<definedNames>{defined}</definedNames>" if defined else "")
            + '<calcPr calcId="124519" fullCalcOnLoad="1"/></workbook>')


def styles_xml(formats: Sequence[tuple[bool, str | None, str | None]], names: Sequence[str]) -> str:
    """Cell formats (bold, fill "RRGGBB" or None, number format or None) as named styles: format i
    is the named style `names[i]` (format 0 is "Normal") and the cell formats (xf) 2i and, with
    Excel's quote prefix, 2i + 1."""
    codes = sorted({code for _, _, code in formats if code and code != GENERAL})
    code_id = {code: 164 + i for i, code in enumerate(codes)}
    fills = sorted({fill for _, fill, _ in formats if fill})
    fill_id = {fill: 2 + i for i, fill in enumerate(fills)}  # 0 none and 1 gray125 are Excel's own
    num_fmts = "".join(f'<numFmt numFmtId="{code_id[c]}" formatCode="{escape_xml(c)}"/>' for c in codes)
    font = '<sz val="11"/><name val="Calibri"/><family val="2"/>'
    fill_xml = "".join(f'<fill><patternFill patternType="solid"><fgColor rgb="FF{f}"/><bgColor indexed="64"/>'
                       "</patternFill></fill>" for f in fills)
    style_xfs, cell_xfs = [], []
    for i, (bold, fill, code) in enumerate(formats):
        ids = f'numFmtId="{code_id.get(code, 0)}" fontId="{int(bold)}" fillId="{fill_id.get(fill, 0)}" borderId="0"'
        style_xfs.append(f"<xf {ids}/>")
        applied = f'{ids} xfId="{i}" applyNumberFormat="1" applyFont="1" applyFill="1"'
        cell_xfs += [f"<xf {applied}/>", f'<xf {applied} quotePrefix="1"/>']
    cell_styles = "".join(f'<cellStyle name="{escape_xml(n)}" xfId="{i}"' + (' builtinId="0"' if i == 0 else "") + "/>"
                          for i, n in enumerate(names))
    return (HEAD + f'<styleSheet xmlns="{MAIN_NS}">'
            + (f'<numFmts count="{len(codes)}">{num_fmts}</numFmts>' if codes else "")
            + f'<fonts count="2"><font>{font}</font><font><b/>{font}</font></fonts>'
            f'<fills count="{2 + len(fills)}"><fill><patternFill patternType="none"/></fill>'
            f'<fill><patternFill patternType="gray125"/></fill>{fill_xml}</fills>'
            '<borders count="1"><border><left/><right/><top/><bottom/><diagonal/></border></borders>'
            f'<cellStyleXfs count="{len(style_xfs)}">{"".join(style_xfs)}</cellStyleXfs>'
            f'<cellXfs count="{len(cell_xfs)}">{"".join(cell_xfs)}</cellXfs>'
            f'<cellStyles count="{len(names)}">{cell_styles}</cellStyles>'
            '<dxfs count="0"/><tableStyles count="0" defaultTableStyle="TableStyleMedium9" '
            'defaultPivotStyle="PivotStyleLight16"/></styleSheet>')


def core_xml(now: datetime.datetime) -> str:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return (HEAD + '<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/'
            'core-properties" xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:dcterms="http://purl.org/dc/terms/" '
            'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><dc:creator>rlprobe</dc:creator>'
            f'<dcterms:created xsi:type="dcterms:W3CDTF">{stamp}</dcterms:created>'
            f'<dcterms:modified xsi:type="dcterms:W3CDTF">{stamp}</dcterms:modified></cp:coreProperties>')


def app_xml() -> str:
    return (HEAD + '<Properties xmlns="http://schemas.openxmlformats.org/officeDocument/2006/extended-properties">'
            "<Application>rlprobe</Application></Properties>")


def sheet_start(selected: bool, dimension: str, widths: Sequence[float], freeze: str | None) -> str:
    """A worksheet up to its first row: dimension, view (frozen at `freeze`), column widths."""
    view = '<sheetView tabSelected="1" workbookViewId="0">' if selected else '<sheetView workbookViewId="0">'
    if freeze and freeze != "A1":
        col, row = _split_ref(freeze)
        x, y = col - 1, row - 1
        pane = "bottomRight" if x and y else ("topRight" if x else "bottomLeft")
        split = (f' xSplit="{x}"' if x else "") + (f' ySplit="{y}"' if y else "")
        view += f'<pane{split} topLeftCell="{freeze}" activePane="{pane}" state="frozen"/>'
        view += f'<selection pane="{pane}" activeCell="{freeze}" sqref="{freeze}"/>'
    view += "</sheetView>"
    cols = "".join(f'<col min="{i}" max="{i}" width="{round(w, 2)}" customWidth="1"/>' for i, w in enumerate(widths, 1))
    return (HEAD + f'<worksheet xmlns="{MAIN_NS}" xmlns:r="{REL_NS}"><dimension ref="{dimension}"/>'
            f'<sheetViews>{view}</sheetViews><sheetFormatPr baseColWidth="8" defaultRowHeight="15"/>'
            + (f"<cols>{cols}</cols>" if cols else "") + "<sheetData>")


def sheet_end(autofilter: str | None, links: Sequence[tuple[str, str, str]]) -> str:
    """A worksheet after its last row: autofilter, internal hyperlinks (cell, location, text), margins."""
    end = "</sheetData>" + (f'<autoFilter ref="{autofilter}"/>' if autofilter else "")
    if links:
        end += "<hyperlinks>" + "".join(f'<hyperlink ref="{ref}" location="{escape_xml(location)}" '
                                        f'display="{escape_xml(text)}"/>' for ref, location, text in links)
        end += "</hyperlinks>"
    return end + ('<pageMargins left="0.75" right="0.75" top="1" bottom="1" header="0.5" footer="0.5"/>'
                  "</worksheet>")


def quoted_sheet(name: str) -> str:
    return "'" + name.replace("'", "''") + "'"


def absolute_range(ref: str) -> str:
    """"A1:E3" as "$A$1:$E$3"."""
    parts = []
    for cell in ref.split(":"):
        letters = cell.rstrip("0123456789")
        parts.append(f"${letters}${cell[len(letters):]}")
    return ":".join(parts)


def _split_ref(ref: str) -> tuple[int, int]:
    """"D2" as (column 4, row 2)."""
    letters = ref.rstrip("0123456789")
    col = 0
    for ch in letters:
        col = col * 26 + ord(ch.upper()) - 64
    return col, int(ref[len(letters):])


def dimension(rows: int, columns: int) -> str:
    return "A1" if rows == 0 or columns == 0 else f"A1:{column_letter(columns - 1)}{rows}"
