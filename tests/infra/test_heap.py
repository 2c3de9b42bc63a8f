import subprocess
import sys

import pytest

from gatedattn.bench.real_model import check_heap
from gatedattn.infra.errors import ConfigError
from gatedattn.infra.heap import can_keep_freed_memory

# A 64 MiB block is freed; where does it go? Measured in a fresh process, glibc's default
# state first, then the kept one: keeping freed memory changes a process for good (and so
# is never set in the test's own process).
FREE_AFTER_64_MIB = """
import torch
from gatedattn.infra.heap import heap_free_bytes, keep_freed_memory

def free_after_64_mib():
    block = torch.empty(64 << 20, dtype=torch.uint8)
    block.fill_(1)
    del block
    return heap_free_bytes()

default = free_after_64_mib()
assert keep_freed_memory()
print(default, free_after_64_mib())
"""


@pytest.mark.skipif(not can_keep_freed_memory(), reason="needs glibc's malloc")
def test_kept_heap_holds_a_freed_block_for_the_next_allocation():
    out = subprocess.run([sys.executable, "-c", FREE_AFTER_64_MIB], capture_output=True, text=True, check=True)
    default, kept = map(int, out.stdout.split())
    assert kept >= 64 << 20  # kept in the heap, no page faults on its next use
    assert default < 64 << 20  # glibc's default: unmapped, back to the kernel


def test_a_heap_that_is_not_one_of_the_states_is_refused_naming_them():
    check_heap("default")
    with pytest.raises(ConfigError, match=r"heap='kep' must be one of default, kept"):
        check_heap("kep")
