"""probe.monitor_params(): a fingerprint of every parameter after each optimizer step
(docs/dump-format.md, "param"; docs/compare.md, "Parameter updates").

The framework's adapter hooks the optimizer's step (after it, so the weights are the updated
ones) and queues the fingerprints on the parameters' device from the training thread; the host
copy is awaited and the rows written by the probe's background writer. The step is the count of
the hooked optimizer's own `step()` calls, as for the gradient monitor; it works without one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from rlprobe.errors import ProbeError
from rlprobe.frameworks import adapter_for_optimizer, optimizer_kinds
from rlprobe.frameworks.base import OptimizerStep, ParamFilter
from rlprobe.lake.grad_stats import GradSpec, ParamBatch, param_rows
from rlprobe.lake.layout import check_text
from rlprobe.selection import parse_int_set

if TYPE_CHECKING:
    from rlprobe.capture.calls import MonitoredProbe


class ParamMonitor:
    """A removable parameter-fingerprint monitor (what `Probe.monitor_params` returns)."""

    def __init__(self, probe: "MonitoredProbe", model: Any = None, optimizer: Any = None, *, name: str = "default",
                 params: Any = None, steps: Any = None, ranks: Any = None):
        where = f"monitor_params(name={name!r})"
        if not isinstance(name, str) or not name.strip() or "/" in name or ".." in name:
            raise ProbeError(f"{where}: name must be a plain non-empty string such as 'actor'")
        check_text(name, "monitor name", where)
        try:
            self.steps = None if steps is None else set(parse_int_set(steps, "steps") or []) or None
            self.ranks = None if ranks is None else set(parse_int_set(ranks, "ranks") or []) or None
        except ValueError as e:
            raise ProbeError(f"{where}: {e}") from None
        if model is None and optimizer is None:
            raise ProbeError(f"{where}: give a model, an optimizer or both "
                             "(monitor_params(model, optimizer=opt) or, for MindSpore, monitor_params(optimizer=opt))")
        adapter = adapter_for_optimizer(model, optimizer)
        if adapter is None:
            raise ProbeError(f"{where}: expected {optimizer_kinds()}; "
                             f"got model={type(model).__name__}, optimizer={type(optimizer).__name__}")
        self._filter = ParamFilter([params] if isinstance(params, str) else list(params or []))
        self.probe, self.name, self.adapter, self.framework = probe, name, adapter, adapter.name
        self.count = 0  # this optimizer's step() calls seen so far
        self._removed = False
        self._specs: list[GradSpec] | None = None  # parameters keep their names, dtypes and shapes
        self._reading: Callable[[], None] | None = None  # waits until the last fingerprints read the weights
        self._hooks = adapter.hook_optimizer(model, optimizer, self._filter, where, self._before_step,
                                             self._after_step)

    @property
    def optimizer(self) -> Any:
        """The hooked optimizer; None while a model's optimizer has not stepped yet."""
        return self._hooks.optimizer

    def _before_step(self, at: OptimizerStep) -> None:
        """The optimizer is about to change the weights: a CPU fingerprint still reading them
        (torch_grads.CpuFingerprints) finishes first. Device fingerprints are queued on the
        device before this step's kernels, so they need no wait."""
        if self._reading is not None:
            self._reading()
            self._reading = None

    def _after_step(self, at: OptimizerStep) -> None:
        """The hooked optimizer has stepped: queue the fingerprints of the weights it left."""
        step = self.count
        self.count += 1
        if self._removed or self.probe.closed or (self.steps is not None and step not in self.steps) \
                or (self.ranks is not None and self.probe.rank not in self.ranks):
            return
        named = at.params()
        if not named:
            return
        if self._specs is None or len(self._specs) != len(named):
            self._specs = [GradSpec(n, self.adapter.dtype_name(p), tuple(p.shape)) for n, p in named]
        finish, nbytes = self.adapter.param_fingerprints([p for _, p in named])
        self._reading = getattr(finish, "reads_done", None)
        self._submit(step, self._specs, finish, nbytes)

    def _submit(self, step: int, specs: list[GradSpec], finish: Callable[[], ParamBatch], nbytes: int) -> None:
        probe = self.probe
        monitor, framework, probe_step = self.name, self.framework, probe.current_step
        submit_rows(probe.writer,
                    "param", f"monitor_params {monitor!r} step {step}: fingerprints failed", finish,
                    lambda batch: param_rows(batch, specs, range(len(specs)), monitor=monitor, step=step,
                                             probe_step=probe_step, framework=framework),
                    nbytes, {"monitor": monitor, "step": step})
        probe.wrote_rows()
        probe.raise_background_errors()

    def remove(self) -> None:
        """Remove every hook this monitor installed (also done by `Probe.close()`)."""
        self._removed = True
        self._hooks.remove()

    def __enter__(self) -> "ParamMonitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"ParamMonitor({self.name!r}, {self.framework}, step {self.count})"



def submit_rows(writer: Any, kind: str, what: str, finish: Callable[[], Any], rows: Callable[[Any], Any],
                nbytes: int, detail: dict[str, Any]) -> None:
    """Queue on the probe's writer a job adding `rows(finish())` as rows of `kind` (fingerprints read off the
    device: monitor_params', and the weights of a stage block, stages.py); a batch that fails is the
    error "`what`: TYPE: message", recorded with `detail`."""
    def job() -> None:
        sink = writer.sink
        try:
            batch = finish()
        except Exception as e:
            msg = f"{what}: {type(e).__name__}: {e}"
            sink.record_error(msg, {"kind": kind, **detail, "what": "rows"})
            writer.report([msg])
            return
        for row in rows(batch):
            sink.add_row(kind, row)

    writer.submit(job, nbytes)
