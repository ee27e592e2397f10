"""Backward capture of torch modules that leaves the autograd graph as it is.

torch's `register_full_backward_hook` wraps a module's inputs and outputs in identity
autograd nodes (BackwardHookFunction). Those nodes change the order in which autograd sums
the gradients of a tensor used twice, so a training step with them differs in the last bits
from one without. Here nothing is added to the graph:

- grad_output: hooks on the output tensors themselves (`register_multi_grad_hook`, tensor
  hooks), called once every output gradient this backward computes is ready;
- grad_input: hooks on the autograd nodes the module's forward created
  (`Node.register_hook`): the gradients they send along their edges into the module's
  positional input tensors are added up per input, which is what the identity node on the
  inputs would have received. The hook fires when the last of them has arrived.

What the rows mean is torch's: grad_output a tuple over the top-level output (a tensor, or
the items of a tuple; other outputs, e.g. dicts, have no backward rows), grad_input a tuple
over the positional arguments (keyword arguments have none), None where no gradient exists.
Known differences, both where a module hands a tensor it did not create straight through:
an output that *is* one of its inputs (an identity) reports that tensor's whole gradient,
including uses outside the module, as grad_output (and passes it on as grad_input); torch
would report only the gradient of the returned value. A module's grad_input sums the
contributions of its nodes in the order they arrive, not autograd's order (equal up to
float rounding when an input is used more than once inside the module).

The hooks on the torch optimizer that steps a model's parameters (TorchOptimizerHooks: what `monitor_grads`
needs) are here too. Given the optimizer, its own pre-step hook is installed at once. Given only the model, a
global pre-step hook waits for the first optimizer that steps one of its parameters, hooks that one and removes
itself: so the step is the count of that optimizer's own `step()` calls (a critic optimizer in the same process
never advances an actor's count), and a step a grad scaler skips (it does not call `optimizer.step()`) is not
counted.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.autograd.graph import register_multi_grad_hook

from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import Handle, OptimizerHooks, OptimizerStep, ParamFilter, StepCallback

_next_sequence_nr = getattr(torch._C._autograd, "_get_sequence_nr", None)
_will_execute = torch._C._will_engine_execute_node


class ModuleBackward(Handle):
    """The backward capture of one module: forward hooks that hook each call's outputs and inner nodes."""

    def __init__(self, module: Any, callback: Callable) -> None:
        self.module, self.callback = module, callback
        self.starts: list[int] = []  # sequence number where each running forward began (calls can nest)
        self.calls: list[_CallBackward] = []
        self.handles = [module.register_forward_pre_hook(self._pre, prepend=False),
                        module.register_forward_hook(self._post, prepend=True)]

    def _pre(self, module: Any, args: Any) -> None:
        self.starts.append(_next_sequence_nr() if _next_sequence_nr is not None else 0)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        start = self.starts.pop() if self.starts else 0
        if not torch.is_grad_enabled():
            return
        outputs = output if isinstance(output, tuple) else (output,)
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in outputs):
            self.calls.append(_CallBackward(self, args, outputs, start))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        for call in self.calls:
            call.remove()
        self.calls.clear()


class _CallBackward:
    """One forward call's hooks; holds graph nodes until the stage ends (`remove`)."""

    def __init__(self, owner: ModuleBackward, args: tuple, outputs: tuple, start: int) -> None:
        self.owner, self.n_inputs, self.n_outputs = owner, len(args), len(outputs)
        self.out_pos = [i for i, t in enumerate(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
        self.handles: list[Any] = []
        inputs = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        # an output that is one of the inputs passes its gradient straight on
        self.identity = {k: next(i for i, a in inputs if a is outputs[p])
                         for k, p in enumerate(self.out_pos) if any(a is outputs[p] for _, a in inputs)}
        self.inner = _edges_into_inputs([outputs[p] for p in self.out_pos], inputs, start) if inputs else {}
        self.has_inputs = bool(inputs)
        for node, edges in self.inner.items():
            self.handles.append(node.register_hook(self._node_hook(edges)))
        self.handles.append(register_multi_grad_hook([outputs[p] for p in self.out_pos], self._outputs_ready))
        self.grad_output: tuple | None = None
        self.sums: dict[int, Any] = {}
        self.waiting = 0

    def _outputs_ready(self, grads: Any) -> None:
        grad_output: list[Any] = [None] * self.n_outputs
        for p, g in zip(self.out_pos, grads):
            grad_output[p] = g
        self.grad_output, self.sums = tuple(grad_output), {}
        for k, pos in self.identity.items():
            self._add(pos, grads[k])
        self.waiting = sum(1 for node in self.inner if _will_execute(node)) if self.has_inputs else 0
        if self.waiting == 0:
            self._fire()

    def _node_hook(self, edges: list[tuple[int, int]]) -> Callable:
        def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
            if self.grad_output is None:  # reached without passing through the outputs (double backward)
                return
            for j, pos in edges:
                self._add(pos, grad_inputs[j])
            self.waiting -= 1
            if self.waiting == 0:
                self._fire()

        return hook

    def _add(self, pos: int, grad: Any) -> None:
        if grad is not None:
            self.sums[pos] = grad if pos not in self.sums else self.sums[pos] + grad

    def _fire(self) -> None:
        grad_input = tuple(self.sums.get(i) for i in range(self.n_inputs))
        grad_output, self.grad_output, self.sums = self.grad_output, None, {}
        self.owner.callback(self.owner.module, grad_input, grad_output)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.inner = {}


def _edges_into_inputs(outputs: list[torch.Tensor], inputs: list[tuple[int, torch.Tensor]],
                       start: int) -> dict[Any, list[tuple[int, int]]]:
    """Nodes created by this forward (sequence number >= start) -> [(edge index, input position)]
    for each of their edges that ends at a positional input tensor."""
    by_node = {(a.grad_fn, a.output_nr): i for i, a in inputs if a.grad_fn is not None}
    leaves = {id(a): i for i, a in inputs if a.grad_fn is None}
    found: dict[Any, list[tuple[int, int]]] = {}
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node in seen or node._sequence_nr() < start:
            continue
        seen.add(node)
        for j, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            pos = by_node.get((nxt, nr))
            if pos is None and hasattr(nxt, "variable"):
                pos = leaves.get(id(nxt.variable))
            if pos is not None:
                found.setdefault(node, []).append((j, pos))
            elif not hasattr(nxt, "variable"):
                stack.append(nxt)
    return found


def is_torch_training(model: Any, optimizer: Any) -> bool:
    return any(isinstance(x, (torch.nn.Module, torch.optim.Optimizer)) for x in (model, optimizer) if x is not None)


class TorchOptimizerHooks(OptimizerHooks):
    def __init__(self, model: Any, optimizer: Any, select: ParamFilter, where: str, before_step: StepCallback,
                 after_step: StepCallback | None):
        self.where = where
        self.before_step, self.after_step = before_step, after_step
        self.optimizer = None
        self._handles: list[Any] = []
        self._global: Any = None
        self._removed = False
        self._named = self._selected(model, optimizer, select)
        self._step = OptimizerStep(self._grads, lambda: list(self._named))
        if optimizer is not None:
            self._attach(optimizer)
        else:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._global = register_optimizer_step_pre_hook(self._discover)
            self._handles.append(self._global)

    def _selected(self, model: Any, optimizer: Any, select: ParamFilter) -> list[tuple[str, Any]]:
        if model is not None:
            named = list(model.named_parameters())
        else:
            named = []
            for g, group in enumerate(optimizer.param_groups):
                names = group.get("param_names") or [f"param_groups.{g}.{i}" for i in range(len(group["params"]))]
                named.extend(zip(names, group["params"]))
        chosen = [(n, p) for n, p in named if p.requires_grad and select(n)]
        if not chosen:
            raise ProbeError(f"{self.where}: no trainable parameter matches params={select.patterns!r}; "
                             f"names look like {[n for n, _ in named[:3]]!r}")
        return chosen

    def _discover(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global pre-step hook, only until the optimizer that steps these parameters is found."""
        if self.optimizer is not None or self._removed:
            return
        ours = {id(p) for _, p in self._named}
        if any(id(p) in ours for group in optimizer.param_groups for p in group["params"]):
            # its own hooks run after the global ones, so the hook added now counts this very step
            self._attach(optimizer)

    def _attach(self, optimizer: Any) -> None:
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(n, p) for n, p in self._named if id(p) in stepped]
        if not named:
            raise ProbeError(f"{self.where}: the optimizer steps none of the monitored "
                             "parameters; pass the optimizer of this model")
        self._named = named
        self.optimizer = optimizer
        self._handles.append(optimizer.register_step_pre_hook(self._pre_step))
        if self.after_step is not None:
            self._handles.append(optimizer.register_step_post_hook(self._post_step))

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._global is not None:  # safe now: the global hooks have finished running
            self._global.remove()
            self._global = None
        self.before_step(self._step)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.after_step(self._step)  # type: ignore[misc]

    def _grads(self) -> list[tuple[str, Any]]:
        found = []
        for name, p in self._named:
            g = getattr(p, "main_grad", None)  # Megatron keeps the fp32 gradient here
            g = p.grad if g is None else g
            if g is not None:  # no gradient this step (unused in the forward): no row
                found.append((name, g))
        return found

    def remove(self) -> None:
        self._removed = True
        for h in self._handles:
            h.remove()
        self._handles.clear()
