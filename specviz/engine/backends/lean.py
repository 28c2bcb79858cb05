"""The Llama family's lean forward over a DynamicCache: engine/cpu/lean_forward.py, bit-identical
to `model(...)`, with the C layer stack where every layer is on the kernels (w4a8).

What lean_forward.eligible asks of a model (family, row-wise attention, fused or kernel layers,
the standard rotary, the stack's float32 CPU rows) is asked once and held until
kernel_layer.moved() is said (a module swapped, tensors re-homed, the attention implementation
or kernel_layer.off() changed); per call only a forward hook (a profile timing the model) and
the number of rows decide. Everything else takes `model(...)` (eager.py): the same bits.
"""
from __future__ import annotations

from ..cpu import kernel_layer, lean_forward
from .eager import Eager


class Lean(Eager):
    def __init__(self):
        self.epoch = -1  # kernel_layer.epoch() the plan below was made at
        self.rows, self.stack, self.joint = 0, None, False  # lean_forward.plan's answer

    def plan(self, model) -> None:
        epoch = kernel_layer.epoch()
        self.rows, self.stack, self.joint = lean_forward.plan(model)
        self.epoch = epoch

    def forward(self, model, ids: list[int], cache, keep: int):
        if self.epoch != kernel_layer.epoch():
            self.plan(model)
        if 0 < len(ids) <= self.rows and not (model._forward_hooks or model._forward_pre_hooks):
            return lean_forward.run(model, ids, cache, keep, self.stack, self.joint)[0]
        return Eager.forward(self, model, ids, cache, keep)

    def forward_masked(self, model, ids: list[int], positions: list[int], bias, cache, keep: int):
        # the whole stack as one C call where every layer is on the kernels: the same bits
        fast = lean_forward.forward_masked(model, ids, positions, bias, cache, keep)
        if fast is not None:
            return fast
        return Eager.forward_masked(self, model, ids, positions, bias, cache, keep)

    def rows_exact(self, model, n: int) -> bool:
        return lean_forward.rows_exact(model, n)

    def keys(self, model, ids: list[int], cache) -> None:
        if lean_forward.eligible(model, len(ids)):
            lean_forward.forward(model, ids, cache, 0)  # the keys alone: no output layer (~5 ms, 1.5B)
        else:
            Eager.forward(self, model, ids, cache, 1)
