"""Words shared by the xlsx Summary sheet, the Markdown summary and the console: the one-line verdict,
next_config as YAML, numbers in prose, and which roll-up columns to show."""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from rlprobe.report.headers import check_lang, header, label

if TYPE_CHECKING:
    import pyarrow as pa

# summary.json roll-up columns that exist for sorting, not for readers
HIDDEN_ROLLUP_COLUMNS = frozenset({"flow_position", "canonical_key"})
# a canonical status order for counts; others follow alphabetically
STATUS_ORDER = ("match", "stats_only_match", "close", "stats_only_close", "absent_in_both", "mismatch", "stats_only_mismatch", "shape_mismatch",
                "dtype_mismatch", "absent_in_a", "absent_in_b", "only_in_a", "only_in_b", "error")
# None in both runs agrees; so do close rows (within rounding: rlprobe/comparison/tolerance.py)
MATCHING_STATUSES = frozenset({"match", "stats_only_match", "close", "stats_only_close", "absent_in_both"})


def format_number(value: Any) -> str:
    """A number for prose and Markdown: integers whole, floats with 4 significant digits."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0:
            return "0"
        if 1e-3 <= abs(value) < 1e6:
            return f"{value:.6g}"
        return f"{value:.4e}"
    return str(value)


def differs(summary: Mapping[str, Any]) -> bool:
    """Whether the comparison found a difference: in key data, module dumps or gradients."""
    return any(summary.get(k) for k in ("first_divergence", "module_first_divergence", "grad_first_flagged"))


def within_rounding(difference: Mapping[str, Any], lang: str = "en") -> str:
    """"first difference, within rounding: 'KEY' step S (max|a-b|/max|a| X, rtol Y, its source)" of
    summary.json's first_difference."""
    colon = "：" if lang == "zh" else ": "
    where = [repr(difference.get("key")), f"step {difference.get('step')}"]
    if difference.get("rank"):
        where.append(f"rank {difference['rank']}")
    figures = [f"{header(f, lang)} {format_number(difference[f])}" for f in ("norm_rel_err", "rtol")
               if difference.get(f) is not None]
    if difference.get("tolerance_source"):
        figures.append(str(difference["tolerance_source"]))
    text = f"{label('first_difference', lang)}{colon}{', '.join(where)}"
    return text + (f" ({', '.join(figures)})" if figures else "")


def verdict(summary: Mapping[str, Any], lang: str = "en") -> str:
    """One line: where the runs first part ways, or that they do not."""
    check_lang(lang)
    first = summary.get("first_divergence")
    colon = "：" if lang == "zh" else ": "
    if not first:
        module, grad = summary.get("module_first_divergence"), summary.get("grad_first_flagged")
        if module:
            name = module.get("module") or "(model)"
            return (f"{label('module_divergence', lang)}{colon}{module.get('stage')} step {module.get('step')}, "
                    f"rank {module.get('rank')}, {name!r} call {module.get('call')} {module.get('direction')} "
                    f"— {module.get('status', '?')}")
        if grad:
            return (f"{label('grads_flagged', lang)}{colon}monitor {grad.get('monitor')!r}, step {grad.get('step')}, "
                    f"rank {grad.get('rank')} — weighted similarity {format_number(grad.get('weighted_similarity'))}")
        if summary.get("first_difference"):  # only close rows: within rounding
            return f"{label('no_divergence_beyond_rounding', lang)} — {within_rounding(summary['first_difference'], lang)}"
        return label("nothing_compared" if summary.get("compared") == [] else "no_divergence", lang)
    where = []
    if first.get("key") is not None:
        where.append(repr(first["key"]))
    for field in ("step", "rank", "micro_step"):
        if first.get(field) is not None:
            where.append(f"{field} {first[field]}")
    if first.get("index") not in (None, ""):
        where.append(f"{header('index', lang)} {first['index']!r}")
    errors = [f"{header(f, lang)} {format_number(first[f])}" for f in ("max_abs_err", "max_rel_err")
              if first.get(f) is not None]
    sep = "，" if lang == "zh" else ", "
    text = f"{label('first_divergence', lang)}{colon}{sep.join(where)} — {first.get('status', '?')}"
    if errors:
        text += f" ({sep.join(errors)})"
    return text


_YAML_PLAIN = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./ \-]*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "~"}


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if value != value else (".inf" if value > 0 else "-.inf")
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    plain = (_YAML_PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS and not text.endswith(" ")
             and not re.match(r"\d{4}-\d\d?-\d\d?", text))  # YAML 1.1 would read a date
    if plain:
        try:
            float(text.replace("_", ""))  # would read back as a number
            plain = False
        except ValueError:
            pass
    return text if plain else json.dumps(text, ensure_ascii=False)  # JSON strings are valid YAML


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, (Mapping, list, tuple))


def yaml_lines(value: Any, indent: int = 0) -> list[str]:
    """`value` (dicts, lists, scalars) as block-style YAML lines, good enough to paste into a config."""
    pad = "  " * indent
    if isinstance(value, Mapping):
        if not value:
            return [pad + "{}"]
        lines = []
        for k, v in value.items():
            if isinstance(v, Mapping) and v or isinstance(v, (list, tuple)) and not all(map(_is_scalar, v)):
                lines.append(f"{pad}{_yaml_scalar(k)}:")
                lines += yaml_lines(v, indent + 1)
            else:
                lines.append(f"{pad}{_yaml_scalar(k)}: {yaml_lines(v)[0].strip()}")
        return lines
    if isinstance(value, (list, tuple)):
        if not value:
            return [pad + "[]"]
        if all(map(_is_scalar, value)):
            return [pad + "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"]
        lines = []
        for v in value:
            sub = yaml_lines(v, indent + 1)
            lines.append(f"{pad}- {sub[0].strip()}")
            lines += sub[1:]
        return lines
    return [pad + _yaml_scalar(value)]


def rollup_columns(records: Iterable[Mapping[str, Any]], preferred: Sequence[str] = ()) -> list[str]:
    """Columns of a list of roll-up records: `preferred` first (where present), then the rest in
    the order met, without the internal ones."""
    seen: dict[str, None] = {}
    for record in records:
        for k in record:
            if k not in HIDDEN_ROLLUP_COLUMNS:
                seen.setdefault(k, None)
    return [c for c in preferred if c in seen] + [c for c in seen if c not in preferred]


def ordered_counts(counts: Mapping[str, int] | None) -> list[tuple[str, int]]:
    counts = counts or {}
    known = [(s, counts[s]) for s in STATUS_ORDER if s in counts]
    return known + sorted((s, n) for s, n in counts.items() if s not in STATUS_ORDER)


def list_text(value: Sequence[Any]) -> str:
    """A list cell as msprobe writes shapes: "[4, 16]", "[]" for a scalar."""
    return "[" + ", ".join(str(v) for v in value) + "]"


def list_texts(values: pa.Array) -> pa.Array:
    """list_text of each list of an Arrow list array (null stays null), as a string array: lists of
    integers (shapes) with pyarrow.compute, others one at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    item = values.type.value_type
    if pa.types.is_integer(item) and pc.list_flatten(values).null_count == 0:
        joined = pc.binary_join(pc.cast(values, pa.list_(pa.string())), ", ")
        return pc.binary_join_element_wise("[", joined, "]", "")
    return pa.array([None if v is None else list_text(v) for v in values.to_pylist()], pa.string())


def cell_text(value: Any) -> Any:
    """Lists (e.g. diverged keys) as comma-separated text; dicts as compact JSON; the rest as is."""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, ensure_ascii=False, default=str)
    return value
