"""probe.monitor_grads(): per-optimizer-step gradient statistics and sign maps (docs/grads.md).

The step is the count of the hooked optimizer's own `step()` calls, so a critic optimizer in
the same process never advances an actor's count, and a step a grad scaler skips (it does not
call `optimizer.step()`) is not counted. The framework's adapter hooks the optimizer and queues
the device work on the training thread; the host copy is awaited and the files written by the
probe's background writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from rlprobe.errors import ProbeError
from rlprobe.frameworks import adapter_for_optimizer, optimizer_kinds
from rlprobe.frameworks.base import OptimizerStep, ParamFilter
from rlprobe.lake.grad_stats import GradBatch, GradSpec, check_bounds, check_level, grad_rows
from rlprobe.lake.layout import check_text
from rlprobe.selection import parse_int_set

if TYPE_CHECKING:
    from rlprobe.capture.calls import MonitoredProbe

DEFAULT_BOUNDS = (-1.0, 0.0, 1.0)  # msprobe's default


class GradMonitor:
    """A removable gradient monitor (what `Probe.monitor_grads` returns)."""

    def __init__(self, probe: "MonitoredProbe", model: Any = None, optimizer: Any = None, *, name: str = "default",
                 level: str = "L1", bounds: Sequence[float] | None = None, params: Sequence[str] | None = None,
                 steps: Any = None, ranks: Any = None):
        where = f"monitor_grads(name={name!r})"
        if not isinstance(name, str) or not name.strip() or "/" in name or ".." in name:
            raise ProbeError(f"{where}: name must be a plain non-empty string such as 'actor'")
        check_text(name, "monitor name", where)
        try:
            self.level = check_level(level)
            self.bounds = check_bounds(DEFAULT_BOUNDS if bounds is None else bounds)
            self.steps = None if steps is None else set(parse_int_set(steps, "steps") or []) or None
            self.ranks = None if ranks is None else set(parse_int_set(ranks, "ranks") or []) or None
        except ValueError as e:
            raise ProbeError(f"{where}: {e}") from None
        if isinstance(params, str):
            params = [params]
        self._filter = ParamFilter(list(params or []))
        self.patterns = self._filter.patterns
        self.probe = probe
        self.name = name
        self.count = 0  # this optimizer's step() calls seen so far
        self._removed = False
        self._kernels: dict[str, Any] = {}  # device kernels' buffers, reused every step (Adapter.grad_stats)
        if model is None and optimizer is None:
            raise ProbeError(f"{where}: give a model, an optimizer or both "
                             "(monitor_grads(model, optimizer=opt) or, for MindSpore, monitor_grads(optimizer=opt))")
        adapter = adapter_for_optimizer(model, optimizer)
        if adapter is None:
            raise ProbeError(f"{where}: expected {optimizer_kinds()}; "
                             f"got model={type(model).__name__}, optimizer={type(optimizer).__name__}")
        self.adapter = adapter
        self.framework = adapter.name
        self._hooks = adapter.hook_optimizer(model, optimizer, self._filter, where, self._before_step)

    @property
    def optimizer(self) -> Any:
        """The hooked optimizer; None while a model's optimizer has not stepped yet."""
        return self._hooks.optimizer

    def selects(self, param: str) -> bool:
        return self._filter(param)

    # -- hooks ---------------------------------------------------------------------------
    def _before_step(self, at: OptimizerStep) -> None:
        """The hooked optimizer is about to step: count it, and capture its gradients if wanted."""
        step = self._next_step()
        if step is None:
            return
        try:
            named = at.grads()
        except ProbeError as e:
            raise ProbeError(f"monitor_grads(name={self.name!r}) step {step}: {e}") from None
        if not named:
            return
        specs = [GradSpec(name, self.adapter.dtype_name(g), tuple(g.shape)) for name, g in named]
        finish, nbytes = self.adapter.grad_stats([g for _, g in named], self.level, self.bounds, self._kernels)
        self.submit(step, specs, finish, nbytes)

    def _next_step(self) -> int | None:
        """Count this optimizer step; its number when it is to be captured, else None."""
        step = self.count
        self.count += 1
        if self._removed or self.probe.closed:
            return None
        if self.steps is not None and step not in self.steps:
            return None
        if self.ranks is not None and self.probe.rank not in self.ranks:
            return None
        return step

    # -- writing -------------------------------------------------------------------------
    def submit(self, step: int, specs: list[GradSpec], finish: Callable[[], GradBatch], nbytes: int) -> None:
        """Hand one captured step to the probe's background writer."""
        probe = self.probe
        writer, layout, rank = probe.writer, probe.layout, probe.rank
        monitor, level, bounds, framework = self.name, self.level, self.bounds, self.framework
        probe_step = probe.current_step

        def job() -> None:
            sink = writer.sink
            where = f"monitor {monitor!r} step {step}"
            try:
                batch = finish()
            except Exception as e:
                msg = f"{where}: gradient statistics failed: {type(e).__name__}: {e}"
                sink.record_error(msg, {"kind": "grad", "monitor": monitor, "step": step, "what": "rows"})
                writer.report([msg])
                return
            try:
                sign_file = None
                if batch.signs is not None:
                    path = layout.grad_signs(monitor, step, rank)
                    try:
                        sign_file = sink.write_tensor(path, batch.signs)
                    except OSError as e:
                        msg = f"{where}: sign map not written to {path}: {e}; its statistics are kept"
                        sink.record_error(msg, {"kind": "grad", "monitor": monitor, "step": step, "what": "signs"})
                        writer.report([msg])
                rows = grad_rows(batch, specs, monitor=monitor, step=step, probe_step=probe_step, level=level,
                                 framework=framework, bounds=bounds, sign_file=sign_file)
            finally:
                if batch.release is not None:  # the arrays were views of a staging ring slot
                    batch.release()
            for row in rows:
                sink.add_row("grad", row)

        writer.submit(job, nbytes)
        probe.wrote_rows()
        probe.raise_background_errors()

    def remove(self) -> None:
        """Remove every hook this monitor installed (also done by `Probe.close()`)."""
        self._removed = True
        self._hooks.remove()

    def __enter__(self) -> "GradMonitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"GradMonitor({self.name!r}, level={self.level}, {self.framework}, step {self.count})"

