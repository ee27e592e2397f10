"""Column headers and labels of every report, per language (`lang`: "en" or "zh").

The data keeps its column names (`same_pct`, `max_abs_err`); only reports show these words.
Chinese headers of the columns msprobe has are msprobe's own, so its users find what they know.
"""

from __future__ import annotations

from typing import Iterable

from rlprobe.errors import ProbeError

LANGS = ("en", "zh")

# column -> (English, Chinese)
COLUMN_HEADERS: dict[str, tuple[str, str]] = {
    "key": ("key", "数据名"),
    "step": ("step", "step"),
    "rank": ("rank", "rank"),
    "micro_step": ("micro_step", "micro_step"),
    "index": ("index", "id"),
    "status": ("status", "状态"),
    "first_divergence": ("first divergence", "首个分歧"),
    "is_first_divergence": ("first divergence", "首个分歧"),
    "shape_a": ("shape A", "shape1"),
    "shape_b": ("shape B", "shape2"),
    "dtype_a": ("dtype A", "dtype1"),
    "dtype_b": ("dtype B", "dtype2"),
    "numel": ("numel", "元素个数"),
    "equal_count": ("equal count", "相同元素个数"),
    "same_pct": ("same %", "相同元素百分比(%)"),
    "first_mismatch_index": ("first mismatch index", "首个不匹配元素索引"),
    "max_abs_err": ("max abs err", "最大绝对误差"),
    "max_rel_err": ("max rel err", "最大相对误差"),
    "within_1e3_pct": ("within 1e-3 %", "误差在千分之一内元素占比(%)"),
    "within_1e2_pct": ("within 1e-2 %", "误差在百分之一内元素占比(%)"),
    "cosine": ("cosine", "余弦相似度"),
    "nan_mismatch_count": ("NaN mismatches", "NaN不匹配个数"),
    "message": ("message", "说明"),
    "min_a": ("min A", "最小值1"),
    "min_b": ("min B", "最小值2"),
    "max_a": ("max A", "最大值1"),
    "max_b": ("max B", "最大值2"),
    "mean_a": ("mean A", "均值1"),
    "mean_b": ("mean B", "均值2"),
    "norm_a": ("L2 norm A", "L2范数1"),
    "norm_b": ("L2 norm B", "L2范数2"),
    "nan_count_a": ("NaN count A", "NaN个数1"),
    "nan_count_b": ("NaN count B", "NaN个数2"),
    "inf_count_a": ("inf count A", "inf个数1"),
    "inf_count_b": ("inf count B", "inf个数2"),
    "zero_count_a": ("zero count A", "零值个数1"),
    "zero_count_b": ("zero count B", "零值个数2"),
    "hash_a": ("hash A", "哈希1"),
    "hash_b": ("hash B", "哈希2"),
    # roll-ups (summary.json "keys", "steps", "counts", "gates")
    "rows": ("rows", "行数"),
    "match": ("match", "匹配"),
    "mismatch": ("mismatch", "不匹配"),
    "other": ("other", "其他"),
    "matching": ("matching", "匹配行数"),
    "diverging": ("diverging", "分歧行数"),
    "only_in_a": ("only in A", "仅A中有"),
    "only_in_b": ("only in B", "仅B中有"),
    "errors": ("errors", "错误"),
    "first_divergent_step": ("first divergent step", "首个分歧step"),
    "diverged_keys": ("diverged keys", "出现分歧的数据"),
    "min_cosine": ("min cosine", "最小余弦相似度"),
    "close": ("close", "接近"),
    "norm_rel_err": ("max|a-b|/max|a|", "范数相对误差"),
    "max_norm_rel_err": ("max|a-b|/max|a|", "最大范数相对误差"),
    "rtol": ("rtol", "相对容差"),
    "atol": ("atol", "绝对容差"),
    "tolerance_source": ("tolerance from", "容差来源"),
    "envelope": ("envelope (control run)", "噪声包络(对照运行)"),
    "sheet": ("sheet", "工作表"),
    "name": ("name", "名称"),
    "passed": ("passed", "通过"),
}

# msprobe's per-key comparison file: (its name for the column, key_data column it comes from);
# the metrics' headers are COLUMN_HEADERS' (msprobe's own in Chinese)
MSPROBE_METRICS = ("same_pct", "first_mismatch_index", "max_abs_err", "max_rel_err", "within_1e3_pct", "within_1e2_pct")
MSPROBE_LAYOUT: tuple[tuple[str, str], ...] = (
    ("step", "step"), ("rank", "rank"), ("micro_step", "micro_step"),
    ("id", "index"), ("shape1", "shape_a"), ("shape2", "shape_b"),
    *((m, m) for m in MSPROBE_METRICS),
)

# words of the Summary sheet and the Markdown summary
LABELS: dict[str, tuple[str, str]] = {
    "title": ("rlprobe comparison", "rlprobe 比对结果"),
    "run_a": ("run A", "运行A"),
    "run_b": ("run B", "运行B"),
    "verdict": ("verdict", "结论"),
    "first_divergence": ("first divergence", "首个分歧"),
    "no_divergence": ("no divergence: every compared value matches", "无分歧：所有比对的数据一致"),
    "no_divergence_beyond_rounding": ("no divergence beyond rounding", "无超出舍入误差的分歧"),
    "first_difference": ("first difference, within rounding", "首个差异（在舍入误差内）"),
    "close": ("close (within rounding)", "接近（舍入误差内）"),
    "nothing_compared": ("nothing compared: neither run holds key data, gradients, module dumps or parameter "
                         "fingerprints", "未比对任何数据：两次运行都没有关键数据、梯度、模块数据或参数指纹"),
    "module_divergence": ("first module divergence", "首个模块分歧"),
    "grads_flagged": ("gradients flagged", "梯度告警"),
    "suspect": ("suspect", "可疑环节"),
    "advice": ("advice", "建议"),
    "next_config": ("next config", "下一步配置"),
    "counts": ("rows per status", "各状态行数"),
    "per_key": ("per key", "按数据"),
    "per_step": ("per step", "按step"),
    "gates": ("gates", "门禁"),
    "read_errors": ("read errors", "读取错误"),
    "config_diff": ("config diff", "配置差异"),
    "warnings": ("warnings", "警告"),
    "elapsed_s": ("elapsed (s)", "耗时(秒)"),
    "created_at": ("created at", "生成时间"),
    "rlprobe_version": ("rlprobe version", "rlprobe 版本"),
    "pairs_compared": ("tensor pairs compared", "比对的张量对数"),
    "format_a": ("format of run A", "运行A格式"),
    "format_b": ("format of run B", "运行B格式"),
    "first_divergence_marker": ("◀ first divergence", "◀ 首个分歧"),
    "rows_left_out": ("rows left out", "未全部显示"),
    "rows_shown": ("{shown} of {total} rows shown; key_data.csv / key_data.parquet have all",
                   "显示 {total} 行中的 {shown} 行；完整数据见 key_data.csv / key_data.parquet"),
    "rows_shown_in": ("{shown} of {total} rows shown (flagged and differing rows first); {file} has all",
                      "显示 {total} 行中的 {shown} 行（告警与不一致的行优先）；完整数据见 {file}"),
}


def check_lang(lang: object) -> str:
    if lang not in LANGS:
        raise ProbeError(f"report language {lang!r} is not supported; use one of {', '.join(LANGS)}")
    return str(lang)


def header(column: str, lang: str = "en") -> str:
    """The header for `column` in `lang`; a column without one keeps its own name."""
    words = COLUMN_HEADERS.get(column)
    return column if words is None else words[LANGS.index(check_lang(lang))]


def headers(columns: Iterable[str], lang: str = "en") -> list[str]:
    return [header(c, lang) for c in columns]


def label(name: str, lang: str = "en") -> str:
    return LABELS[name][LANGS.index(check_lang(lang))]


def msprobe_headers(lang: str = "zh") -> list[str]:
    """msprobe's per-key file headers in its order; with lang="en" the metrics read in English."""
    check_lang(lang)
    return [header(column, lang) if column in MSPROBE_METRICS else head for head, column in MSPROBE_LAYOUT]
