"""The parameter-update finding (summary's param_first_difference, computed by
rlprobe.comparison.params) as one line for the console, summary.md and the xlsx Summary."""

from __future__ import annotations

from typing import Any, Mapping


def param_line(summary: Mapping[str, Any]) -> str | None:
    """'parameter updates: ...'; None when neither run recorded fingerprints."""
    if "params_compared" not in summary:
        return None
    found = summary.get("param_first_difference")
    if found is None:
        return f"parameter updates: all {summary['params_compared']} fingerprint pairs agree"
    line = (f"parameter updates: the update of step {found['probe_step']} differs first for model "
            f"{found['monitor']!r} (first parameter {found['param']!r}, rank {found['rank']}, "
            f"norm A={found['norm_a']!r}, B={found['norm_b']!r})")
    noise = summary.get("update_noise")
    if noise is not None:  # comparison/params.py: no changed update, the optimizer's amplification of rounding
        line += (f"; rounding noise amplified by the optimizer: only the {noise['params']} of {noise['compared']} "
                 "parameters whose gradients were rounding (near zero or flipped signs) differ")
    return line
