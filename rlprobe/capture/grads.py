"""probe.monitor_grads(): per-optimizer-step gradient statistics and sign maps (docs/grads.md).

The step is the count of the hooked optimizer's own `step()` calls, so a critic optimizer in
the same process never advances an actor's count, and a step a grad scaler skips (it does not
call `optimizer.step()`) is not counted. Device work is queued on the training thread; the
host copy is awaited and the files written by the probe's background writer.
"""

from __future__ import annotations

import fnmatch
import sys
from typing import TYPE_CHECKING, Any, Callable, Sequence

from rlprobe.lake.grad_stats import GradBatch, GradSpec, check_bounds, check_level, grad_rows
from rlprobe.errors import ProbeError
from rlprobe.lake.layout import check_text
from rlprobe.selection import parse_int_set

if TYPE_CHECKING:
    from rlprobe.capture.probe import Probe

DEFAULT_BOUNDS = (-1.0, 0.0, 1.0)  # msprobe's default


class GradMonitor:
    """A removable gradient monitor (what `Probe.monitor_grads` returns)."""

    def __init__(self, probe: "Probe", model: Any = None, optimizer: Any = None, *, name: str = "default",
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
        self.patterns = list(params or [])
        self.probe = probe
        self.name = name
        self.count = 0  # this optimizer's step() calls seen so far
        self.optimizer: Any = None
        self._handles: list[Any] = []
        self._removed = False
        self._kernels: dict[str, Any] = {}  # device kernels' buffers, reused every step (torch_grads.launch)
        if model is None and optimizer is None:
            raise ProbeError(f"{where}: give a model, an optimizer or both "
                             "(monitor_grads(model, optimizer=opt) or, for MindSpore, monitor_grads(optimizer=opt))")
        if _is_mindspore(optimizer) or (optimizer is None and _is_mindspore(model)):
            from rlprobe.frameworks.mindspore_grads import attach

            self.framework = "mindspore"
            self.optimizer = optimizer if optimizer is not None else model
            self._handles.append(attach(self, self.optimizer))
            return
        if not (_is_torch(model) or _is_torch(optimizer)):
            raise ProbeError(f"{where}: expected a torch.nn.Module and/or torch.optim.Optimizer, or a MindSpore "
                             f"optimizer; got model={type(model).__name__}, optimizer={type(optimizer).__name__}")
        self.framework = "torch"
        self._named = self._torch_params(model, optimizer, where)
        if optimizer is not None:
            self._attach_torch(optimizer)
        else:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._global = register_optimizer_step_pre_hook(self._discover)
            self._handles.append(self._global)

    # -- selection -----------------------------------------------------------------------
    def selects(self, param: str) -> bool:
        return not self.patterns or any(fnmatch.fnmatchcase(param, p) for p in self.patterns)

    def _torch_params(self, model: Any, optimizer: Any, where: str) -> list[tuple[str, Any]]:
        if model is not None:
            named = list(model.named_parameters())
        else:
            named = []
            for g, group in enumerate(optimizer.param_groups):
                names = group.get("param_names") or [f"param_groups.{g}.{i}" for i in range(len(group["params"]))]
                named.extend(zip(names, group["params"]))
        chosen = [(n, p) for n, p in named if p.requires_grad and self.selects(n)]
        if not chosen:
            raise ProbeError(f"{where}: no trainable parameter matches params={self.patterns!r}; "
                             f"names look like {[n for n, _ in named[:3]]!r}")
        return chosen

    # -- hooks ---------------------------------------------------------------------------
    def _discover(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global pre-step hook, only until the optimizer that steps these parameters is found."""
        if self.optimizer is not None or self._removed:
            return
        ours = {id(p) for _, p in self._named}
        if any(id(p) in ours for group in optimizer.param_groups for p in group["params"]):
            # its own hooks run after the global ones, so the hook added now counts this very step
            self._attach_torch(optimizer)

    def _attach_torch(self, optimizer: Any) -> None:
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(n, p) for n, p in self._named if id(p) in stepped]
        if not named:
            raise ProbeError(f"monitor_grads(name={self.name!r}): the optimizer steps none of the monitored "
                             "parameters; pass the optimizer of this model")
        self._named = named
        self.optimizer = optimizer
        self._handles.append(optimizer.register_step_pre_hook(self._torch_step))

    def _torch_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        glob = getattr(self, "_global", None)
        if glob is not None:  # safe now: the global hooks have finished running
            glob.remove()
            self._global = None
        grads, specs = [], []
        step = self._next_step()
        if step is None:
            return
        from rlprobe.frameworks import get_adapter

        adapter = get_adapter("torch")
        for name, p in self._named:
            g = getattr(p, "main_grad", None)
            g = p.grad if g is None else g
            if g is None:  # no gradient this step (unused in the forward): no row
                continue
            grads.append(g)
            specs.append(GradSpec(name, adapter.dtype_name(g), tuple(g.shape)))
        if not grads:
            return
        from rlprobe.frameworks.torch_grads import launch

        finish, nbytes = launch(grads, self.level, self.bounds, self._kernels)
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
        writer, layout, rank = probe._writer, probe.layout, probe.rank
        monitor, level, bounds, framework, probe_step = self.name, self.level, self.bounds, self.framework, probe.current_step

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
        probe._step_has_data = True
        probe._raise_background_errors()

    def remove(self) -> None:
        """Remove every hook this monitor installed (also done by `Probe.close()`)."""
        self._removed = True
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> "GradMonitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"GradMonitor({self.name!r}, level={self.level}, {self.framework}, step {self.count})"


def _is_torch(obj: Any) -> bool:
    if obj is None or "torch" not in sys.modules:
        return False
    import torch

    return isinstance(obj, (torch.nn.Module, torch.optim.Optimizer))


def _is_mindspore(obj: Any) -> bool:
    if obj is None or "mindspore" not in sys.modules:
        return False
    import mindspore.nn as msnn

    return isinstance(obj, msnn.Optimizer)
