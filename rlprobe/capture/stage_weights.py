"""The weights at a module dump: a fingerprint of each hooked module's own parameters (recurse=False:
a layer's, not its children's) when a `probe.stage` block starts, as rows of the `module_param`
kind (docs/dump-format.md, "module_param"; docs/modules.md, "Weights at the call").

Once per stage block, not per forward: the weights a block's forwards see change only when an
optimizer steps, which a stage's model does between blocks (the bundled example enters actor_update
once per micro-batch and steps after them). A block that steps its optimizer inside runs later
forwards on weights these rows do not show. The fingerprints are the parameter monitor's (the
adapter's `param_fingerprints`: digest of the raw bytes, float64 sum and norm), for all the block's
parameters at once: on an accelerator queued on the device before the block's forward (so an
optimizer step inside the block comes after them), on the CPU read at once on the training thread
(`background=False`: for a stage's weights a thread costs more than the pass; docs/modules.md gives
the measured figures).
"""

from __future__ import annotations

from typing import Any, Callable

from rlprobe.capture.calls import MonitoredProbe
from rlprobe.capture.params import submit_rows
from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import Adapter
from rlprobe.lake.grad_stats import ParamBatch, WeightSpec, module_weight_rows


def fingerprint_weights(probe: MonitoredProbe, stage: str, block: int, hooked: list[tuple[str, Any, Adapter]],
                        calls: dict[tuple[str, str, str], int]) -> None:
    """Queue the fingerprints of the own parameters of every hooked (path, module, adapter) for the
    stage's `block`-th block of this step; `calls`: the step's forward-call counters, so a row names
    the next call of its module."""
    groups: dict[int, tuple[Adapter, list[WeightSpec], list[Any]]] = {}
    position, reading = 0, ""
    try:
        for path, module, adapter in hooked:
            call = calls.get((stage, path, "forward"), 0)
            for name, param in adapter.own_parameters(module):
                reading = f" (module {path!r}, parameter {name!r})"
                _, specs, params = groups.setdefault(id(adapter), (adapter, [], []))
                specs.append(WeightSpec(path, name, block, call, position, adapter.dtype_name(param),
                                        tuple(param.shape)))
                params.append(param)
                position += 1
        reading = ""
        launched = [(adapter, specs, adapter.param_fingerprints(params, background=False))
                    for adapter, specs, params in groups.values()]
    except (ProbeError, RuntimeError, TypeError, ValueError) as e:  # a dtype or tensor kind it cannot read
        where = f"rank {probe.rank} step {probe.current_step}, stage {stage!r}"
        probe.fail(f"{where}: cannot fingerprint the weights{reading}: {e}; "
                    "stage(..., weights=False) (config: stage_weights: false) dumps the modules without them")
        return
    for adapter, specs, (finish, nbytes) in launched:
        _submit(probe, stage, probe.framework or adapter.name, specs, finish, nbytes)


def _submit(probe: Any, stage: str, framework: str, specs: list[WeightSpec], finish: Callable[[], ParamBatch],
            nbytes: int) -> None:
    step = probe.current_step
    submit_rows(probe.writer,
                "module_param", f"stage {stage!r} step {step}: fingerprints of the weights failed", finish,
                lambda batch: module_weight_rows(batch, specs, stage=stage, step=step, framework=framework),
                nbytes, {"stage": stage, "step": step})
    probe.wrote_rows()
