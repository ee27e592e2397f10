"""The `check:` stage of a pipeline: each run checked on its own (rlprobe/check), its reports in
OUTPUT/check/<run name>/. A pipeline with one run does the check only; with two runs the
comparison runs as before and the check's reports join its output. A failed check makes the
pipeline exit 1, as a failed gate does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rlprobe.errors import DumpReadError


def write_checks(work: Path, pipeline: Any) -> dict[str, Any]:
    """Check every run of the pipeline into work/check/<name>/; returns {name: summary} for summary.json.
    Raises PipelineError (exit 3) for a run that cannot be read, (exit 2) for a bad parameter."""
    from rlprobe.check.run import check_dump
    from rlprobe.pipeline.runner import PipelineError
    from rlprobe.report.check_report import write_check_outputs

    stage = pipeline.spec.check
    found = {}
    for name, path in pipeline.runs.items():
        try:
            result = check_dump(path, dict(stage.params))
        except DumpReadError as e:
            raise PipelineError(f"check of run {name}: {e}", 3) from None
        except ValueError as e:
            raise PipelineError(f"{pipeline.path}: check.params: {e}", 2) from None
        folder = work / "check" / name
        folder.mkdir(parents=True)
        write_check_outputs(result, folder, plots=stage.plots)
        found[name] = {"exit_code": result.exit_code, "failed": [r["check"] for r in result.results.to_pylist()
                                                                 if r["status"] == "fail"],
                       "report": f"check/{name}/summary.md"}
    return found


def checks_failed(checks: dict[str, Any]) -> bool:
    return any(c["exit_code"] == 1 for c in checks.values())


def run_check_only(pipeline: Any) -> Any:
    """A pipeline with one run: check it, publish OUTPUT (summary.json and check/<run>/) whole."""
    import json

    from rlprobe.pipeline.runner import EXIT_GATE_FAILED, EXIT_OK, PipelineResult, _publish, _work_dir
    from rlprobe.report.check_report import _jsonable

    started = time.perf_counter()
    work = _work_dir(pipeline.output)
    try:
        checks = write_checks(work.path, pipeline)
        summary = {"pipeline": {"name": pipeline.spec.name, "file": str(pipeline.path),
                                "runs": {n: str(p) for n, p in pipeline.runs.items()}},
                   "check": checks, "elapsed_s": round(time.perf_counter() - started, 3)}
        (work.path / "summary.json").write_text(json.dumps(_jsonable(summary), indent=2) + "\n", encoding="utf-8")
        _publish(work, pipeline.output)
    finally:
        work.remove()
    code = EXIT_GATE_FAILED if checks_failed(checks) else EXIT_OK
    return PipelineResult(code, pipeline.output, summary, [], {"check_s": time.perf_counter() - started})
