"""Counting the aten ops a block of code runs (shared by the tests of the hot paths)."""

import collections

from torch.utils._python_dispatch import TorchDispatchMode


class Ops(TorchDispatchMode):
    """Counts the aten ops run inside the ``with``, by name (``count``)."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))
