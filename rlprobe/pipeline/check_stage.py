"""The `check:` stage of a pipeline: each run checked on its own (rlprobe.check), its reports in
OUTPUT/check/<run name>/. A pipeline with one run does the check only; with two runs the
comparison runs as before and the check's reports join its output (published whole with it,
rlprobe.report.output_folder). A failed check makes the pipeline exit 1, as a failed gate does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlprobe.errors import DumpReadError, EXIT_GATE_FAILED, EXIT_SPEC, EXIT_UNREADABLE, ProbeError


class CheckStageError(ProbeError):
    """A run the check cannot read (exit 3) or a bad check parameter (exit 2)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def check_runs(runs: dict[str, Path], params: dict[str, Any], spec_path: Path,
               key_map: dict[str, str] | None = None) -> dict[str, Any]:
    """{run name: CheckResult} of every run, its keys read through the pipeline's `key_map:` as the
    comparison reads them. Raises CheckStageError."""
    from rlprobe.checks import check_dump

    found = {}
    for name, path in runs.items():
        try:
            found[name] = check_dump(path, dict(params), key_map=key_map)
        except DumpReadError as e:
            raise CheckStageError(f"check of run {name}: {e}", EXIT_UNREADABLE) from None
        except ValueError as e:
            raise CheckStageError(f"{spec_path}: check.params: {e}", EXIT_SPEC) from None
    return found


def check_summaries(checks: dict[str, Any]) -> dict[str, Any]:
    """summary.json's `check`: per run its exit code, the checks that failed and its report."""
    return {name: {"exit_code": result.exit_code,
                   "failed": [r["check"] for r in result.results.to_pylist() if r["status"] == "fail"],
                   "report": f"check/{name}/summary.md"} for name, result in checks.items()}


def write_check_folders(folder: Path, checks: dict[str, Any], *, plots: bool) -> None:
    """Each run's check reports into folder/check/<name>/ (the output's work folder)."""
    from rlprobe.report.check_report import write_check_outputs

    for name, result in checks.items():
        target = folder / "check" / name
        target.mkdir(parents=True)
        write_check_outputs(result, target, plots=plots)


def checks_failed(summaries: dict[str, Any]) -> bool:
    return any(c["exit_code"] == EXIT_GATE_FAILED for c in summaries.values())
