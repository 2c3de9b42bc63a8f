"""The suite's own settings (tests/conftest.py) hold in the processes that run its tests."""
import gc
import os

import pytest

pytestmark = pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER"), reason="settings of scripts/test.sh's workers")


def test_a_worker_computes_on_one_thread_in_each_library_it_loads_and_tells_its_children_to():
    import torch
    from threadpoolctl import threadpool_info

    assert torch.get_num_threads() == 1
    pools = {pool["internal_api"]: pool["num_threads"] for pool in threadpool_info()}
    assert pools.get("openblas") == 1 and pools.get("openmp") == 1, pools
    assert (os.environ.get("OMP_NUM_THREADS"), os.environ.get("RAYON_NUM_THREADS")) == ("1", "1")


def test_a_worker_runs_its_tests_with_what_collection_imported_frozen():
    assert gc.isenabled() and gc.get_freeze_count() > 100_000 and gc.get_threshold()[0] == 7000
