"""Module-level dumps of one RL stage: `with probe.stage("reference_compute_log_prob", model=ref, steps="2"):`.

Inside the block every submodule's forward inputs (snapshot before its forward runs) and
outputs, and for update stages its backward grad_output/grad_input, become rows of the
`module` stats kind, and `.npy` files with `tensors=True`. Outside the step range nothing is
installed: `Probe.stage` returns one shared null context manager.

Order: `seq` numbers module calls within a step in the order they *finish* (a forward hook
fires after its children's), and backward calls as their hooks fire, so that sorting by seq
puts a layer's rows before those of the containers that enclose it; the first row that
differs in seq order is then the innermost module whose output first changed.

The weights at a module dump (stage_weights): a fingerprint of each hooked module's own parameters
(recurse=False: a layer's, not its children's) when a `probe.stage` block starts, as rows of the `module_param`
kind (docs/dump-format.md, "module_param"; docs/modules.md, "Weights at the call"). Once per stage block, not per
forward: the weights a block's forwards see change only when an optimizer steps, which a stage's model does
between blocks (the bundled example enters actor_update once per micro-batch and steps after them). A block
that steps its optimizer inside runs later forwards on weights these rows do not show. The fingerprints are the
parameter monitor's (the adapter's `param_fingerprints`: digest of the raw bytes, float64 sum and norm), for all
the block's parameters at once: on an accelerator queued on the device before the block's forward (so an
optimizer step inside the block comes after them), on the CPU read at once on the training thread
(`background=False`: for a stage's weights a thread costs more than the pass; docs/modules.md gives the
measured figures).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterator, Mapping

from rlprobe.capture.calls import MonitoredProbe
from rlprobe.capture.params import submit_rows
from rlprobe.capture.writer import TensorRow, write_tensor_rows
from rlprobe.errors import ProbeError
from rlprobe.frameworks import adapter_for_module, module_kinds
from rlprobe.frameworks.base import Adapter, StagedLeaf
from rlprobe.lake.grad_stats import ParamBatch, WeightSpec, module_weight_rows
from rlprobe.lake.layout import check_name
from rlprobe.selection import parse_int_set

STAGES = ("actor_compute_log_prob", "actor_update", "reference_compute_log_prob", "critic_compute_values",
          "critic_update", "reward_compute")
NULL_STAGE = contextlib.nullcontext()  # what a stage outside its steps (or a disabled probe) returns
_MAX_DEPTH = 16


@lru_cache(maxsize=256)
def _step_set(spec: Any) -> frozenset[int] | None:
    parsed = parse_int_set(spec, "steps")
    return None if parsed is None else frozenset(parsed)


def steps_of(spec: Any) -> frozenset[int] | None:
    """`"2-3"`, `[0, "4-6"]`, an int, or None/"all" (every step) -> a set of steps (None = all)."""
    try:
        return _step_set(tuple(spec) if isinstance(spec, list) else spec)
    except (ValueError, TypeError) as e:
        raise ProbeError(f"stage steps={spec!r}: {e}") from None


def stage_context(probe: MonitoredProbe, name: str, model: Any, steps: Any, backward: bool | None, tensors: bool,
                  weights: bool = True):
    """What `Probe.stage` returns: NULL_STAGE outside `steps`, else a StageCapture."""
    wanted = steps_of(steps)
    if wanted is not None and probe.current_step not in wanted:
        return NULL_STAGE
    where = f"rank {probe.rank} step {probe.current_step}"
    if not probe.usable(where):
        return NULL_STAGE
    check_name(name, "stage name", where)
    if model is None:
        raise ProbeError(f"{where}: stage({name!r}) needs model=: a module, a list of modules or a dict name -> module")
    roots = _roots(model, f"{where}, stage {name!r}")
    if backward is None:
        backward = name.endswith("_update")
    return StageCapture(probe, name, roots, bool(backward), bool(tensors), bool(weights))


def _roots(model: Any, where: str) -> list[tuple[str, Any]]:
    if isinstance(model, Mapping):
        roots = []
        for key, m in model.items():
            if not isinstance(key, str) or not key:
                raise ProbeError(f"{where}: model dict keys must be non-empty strings, got {key!r}")
            roots.append((key, m))
        return roots
    if isinstance(model, (list, tuple)):
        return [(f"m{i}", m) for i, m in enumerate(model)]
    return [("", model)]


def _adapter_for(module: Any, where: str) -> Adapter:
    adapter = adapter_for_module(module)
    if adapter is None:
        raise ProbeError(f"{where}: cannot hook a {type(module).__module__}.{type(module).__name__}: module dumps "
                         f"take {module_kinds()} models (or a list/dict of them)")
    return adapter


# -- per-step counters ----------------------------------------------------------------------------
@dataclass
class _StepCounters:
    step: int
    seq: int = 0
    calls: dict[tuple[str, str, str], int] = field(default_factory=dict)
    blocks: dict[str, int] = field(default_factory=dict)  # stage -> its blocks entered in this step


_COUNTERS: "weakref.WeakKeyDictionary[MonitoredProbe, _StepCounters]" = weakref.WeakKeyDictionary()  # per probe, its step's


def _counters(probe: MonitoredProbe) -> _StepCounters:
    c = _COUNTERS.get(probe)
    if c is None or c.step != probe.current_step:
        c = _COUNTERS[probe] = _StepCounters(probe.current_step)
    return c


# -- capture ------------------------------------------------------------------------------------
@dataclass
class ModuleLeaf:
    module: str
    call: int
    direction: str
    io: str
    index: str
    seq: int
    leaf: StagedLeaf


class StageCapture:
    """Hooks on every submodule of the stage's model(s) while the `with` block runs."""

    def __init__(self, probe: MonitoredProbe, stage: str, roots: list[tuple[str, Any]], backward: bool, tensors: bool,
                 weights: bool = True):
        self.probe, self.stage, self.roots, self.backward, self.tensors = probe, stage, roots, backward, tensors
        self.weights = weights
        self.handles: list[Any] = []
        self.active = False
        self._pending: dict[str, list[tuple[list[tuple[str, str]], list[StagedLeaf]]]] = {}

    def __enter__(self) -> "StageCapture":
        where = f"rank {self.probe.rank} step {self.probe.current_step}, stage {self.stage!r}"
        seen: set[int] = set()
        hooked: list[tuple[str, Any, Adapter]] = []
        try:
            for prefix, root in self.roots:
                adapter = _adapter_for(root, where)
                adapter.check_module_hooks(self.backward)
                for name, module in adapter.submodules(root):
                    if id(module) in seen:
                        continue
                    seen.add(id(module))
                    path = f"{prefix}.{name}" if prefix and name else (prefix or name)
                    hooked.append((path, module, adapter))
                    self.handles.extend(adapter.hook_module(
                        module, self._pre_hook(path, adapter), self._post_hook(path, adapter),
                        self._backward_hook(path, adapter) if self.backward else None))
            if self.weights:
                counters = _counters(self.probe)
                block = counters.blocks.get(self.stage, 0)
                counters.blocks[self.stage] = block + 1
                fingerprint_weights(self.probe, self.stage, block, hooked, counters.calls)
        except BaseException:
            self._remove()
            raise
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self.active = False
        self._remove()
        if exc[0] is None:
            self.probe.raise_background_errors()

    def _remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self._pending.clear()

    # hooks ---------------------------------------------------------------------------------------
    def _pre_hook(self, path: str, adapter: Adapter) -> Callable:
        def pre(module, args, kwargs):
            if self.active:
                leaves = list(_tensor_leaves(args, "", adapter)) + list(_tensor_leaves(kwargs, "", adapter))
                self._pending.setdefault(path, []).append(([("input", i) for i, _ in leaves],
                                                           self._stage_values([t for _, t in leaves], adapter)))
            return None

        return pre

    def _post_hook(self, path: str, adapter: Adapter) -> Callable:
        def post(module, args, output):
            if not self.active:
                return None
            stack = self._pending.get(path)
            names, staged = stack.pop() if stack else ([], [])
            out = list(_tensor_leaves(output, "", adapter))
            names = names + [("output", i) for i, _ in out]
            staged = staged + self._stage_values([t for _, t in out], adapter)
            self._submit(path, "forward", names, staged, adapter.name)
            return None

        return post

    def _backward_hook(self, path: str, adapter: Adapter) -> Callable:
        def backward(module, grad_input, grad_output):
            if not self.active:  # torch keeps the hooks of a forward that ran inside the block
                return None
            gout = list(_tensor_leaves(grad_output, "", adapter))
            gin = list(_tensor_leaves(grad_input, "", adapter))
            names = [("grad_output", i) for i, _ in gout] + [("grad_input", i) for i, _ in gin]
            staged = self._stage_values([t for _, t in gout + gin], adapter)
            self._submit(path, "backward", names, staged, adapter.name)
            return None

        return backward

    def _stage_values(self, values: list[Any], adapter: Adapter) -> list[StagedLeaf]:
        if not values:
            return []
        try:
            return adapter.stage(values, keep_raw=self.tensors)
        except ProbeError as e:
            self.probe.fail(f"rank {self.probe.rank} step {self.probe.current_step}, stage {self.stage!r}: {e}")
            return []

    def _submit(self, path: str, direction: str, names: list[tuple[str, str]], staged: list[StagedLeaf],
                framework: str) -> None:
        probe = self.probe
        counters = _counters(probe)
        key = (self.stage, path, direction)
        call = counters.calls.get(key, 0)
        counters.calls[key] = call + 1
        seq = counters.seq
        counters.seq += 1
        if len(names) != len(staged):  # a staging failure was reported (on_error="warn"); keep nothing half-made
            return
        if not staged:
            return
        jobs = [ModuleLeaf(path, call, direction, io, index, seq, leaf) for (io, index), leaf in zip(names, staged)]
        writer, layout, stage, step = probe.writer, probe.layout, self.stage, probe.current_step
        fw, save_tensors = probe.framework or framework, self.tensors
        writer.submit(lambda: write_module_rows(writer, layout, stage, step, fw, jobs, save_tensors),
                      sum(j.leaf.nbytes for j in jobs))
        probe.wrote_rows()


def _tensor_leaves(value: Any, prefix: str, adapter: Adapter, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(index, tensor) of every tensor in nested tuples/lists/dicts; other values (None, ints, strings) are skipped."""
    if depth > _MAX_DEPTH:
        return
    if adapter.is_tensor(value):
        yield prefix, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _tensor_leaves(item, f"{prefix}.{i}" if prefix else str(i), adapter, depth + 1)
    elif isinstance(value, Mapping):
        for name, item in value.items():
            yield from _tensor_leaves(item, f"{prefix}.{name}" if prefix else str(name), adapter, depth + 1)


# -- writer thread ------------------------------------------------------------------------------
def write_module_rows(writer: Any, layout: Any, stage: str, step: int, framework: str, jobs: list[ModuleLeaf],
                      save_tensors: bool) -> None:
    """Writer-thread job: one stats row (and with tensors, one .npy) per tensor of one module call."""
    rank = writer.sink.rank
    items = [
        TensorRow(job.leaf,
                  {"stage": stage, "step": step, "module": job.module, "call": job.call, "direction": job.direction,
                   "io": job.io, "index": job.index, "seq": job.seq, "framework": framework},
                  f"stage {stage!r} step {step} module {job.module!r} call {job.call} {job.io} {job.index!r}",
                  layout.module_tensor(stage, step, rank, job.seq, job.io, job.index) if save_tensors else None)
        for job in jobs
    ]
    write_tensor_rows(writer, "module", items)


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
