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
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.autograd.graph import register_multi_grad_hook

from rlprobe.frameworks.base import Handle

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
