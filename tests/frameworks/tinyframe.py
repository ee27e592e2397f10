"""A framework of a few dozen lines (pure Python lists, no numpy), for the adapter registry test:
tensors, modules with forward hooks, parameters with gradients and an SGD optimizer with step
hooks, shaped like torch's so the adapter has real hooks to install and remove."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator


class Tensor:
    def __init__(self, values: list[float], shape: tuple[int, ...] | None = None):
        self.values = [float(v) for v in values]
        self.shape = shape if shape is not None else (len(self.values),)
        assert math.prod(self.shape) == len(self.values)
        self.grad: Tensor | None = None


class Hooks:
    """Callables that can be removed, each through the handle `add` returns."""

    def __init__(self) -> None:
        self.live: dict[int, Callable] = {}
        self._next = 0

    def add(self, fn: Callable) -> "Handle":
        self._next += 1
        self.live[self._next] = fn
        return Handle(self.live, self._next)

    def __call__(self, *args: Any) -> None:
        for fn in list(self.live.values()):
            fn(*args)


class Handle:
    def __init__(self, table: dict[int, Callable], key: int):
        self.table, self.key = table, key

    def remove(self) -> None:
        self.table.pop(self.key, None)


class Module:
    def __init__(self, **children: "Module"):
        self.children = children
        self.pre_hooks, self.post_hooks = Hooks(), Hooks()

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, child in self.children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def parameters(self) -> list[tuple[str, Tensor]]:
        return [(f"{n}.weight" if n else "weight", m.weight) for n, m in self.named_modules() if isinstance(m, Scale)]

    def __call__(self, x: Tensor) -> Tensor:
        self.pre_hooks(self, (x,), {})
        out = self.forward(x)
        self.post_hooks(self, (x,), out)
        return out

    def forward(self, x: Tensor) -> Tensor:
        for child in self.children.values():
            x = child(x)
        return x


class Scale(Module):
    """y = w * x, elementwise."""

    def __init__(self, weight: list[float]):
        super().__init__()
        self.weight = Tensor(weight)

    def forward(self, x: Tensor) -> Tensor:
        return Tensor([w * v for w, v in zip(self.weight.values, x.values)], x.shape)


class SGD:
    def __init__(self, params: list[Tensor], lr: float):
        self.params, self.lr = params, lr
        self.pre_hooks, self.post_hooks = Hooks(), Hooks()

    def step(self) -> None:
        self.pre_hooks(self)
        for p in self.params:
            if p.grad is not None:
                p.values = [v - self.lr * g for v, g in zip(p.values, p.grad.values)]
        self.post_hooks(self)
