import atexit
import os
import shutil
import tempfile

# torch.compile's on-disk kernel cache (/tmp/torchinductor_<user>) outlives a run; a kernel
# cached by a run with other CPU kernels (ATEN_CPU_CAPABILITY) can crash a later one. The
# suite compiles into a cache of its own. Set before torch is imported.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="gatedattn-tests-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

# Peak FLOP/s (the MFU denominator) timed while tests run would stand in for the machine's
# in the user's cache; the suite keeps its own.
if "GATEDATTN_PEAK_CACHE" not in os.environ:
    os.environ["GATEDATTN_PEAK_CACHE"] = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "peak_flops.json")

import pytest  # noqa: E402
import torch  # noqa: E402

# Under pytest-xdist (scripts/test.sh runs one worker per core) each worker computes on one
# thread, so that the workers do not fight over the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
