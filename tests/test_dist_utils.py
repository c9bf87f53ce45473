"""The multi-process test helper: a rank's failure fails the test; a crash in the process group's
teardown after every rank passed reruns the world once."""
import atexit
import os

import pytest

from dist_utils import run_world


def _abort_at_exit(rank, world, marker_dir, times):
    """Rank 1 passes, then aborts at interpreter exit (after the group's teardown) on the first
    ``times`` runs (counted by files in ``marker_dir``)."""
    if rank == 1:
        runs = len(os.listdir(marker_dir))
        open(os.path.join(marker_dir, f"run{runs}"), "w").close()
        if runs < times:
            atexit.register(os.abort)


def _fails_on_rank_1(rank, world):
    if rank == 1:
        raise RuntimeError("rank 1 computed something wrong")


def test_teardown_crash_reruns_once(tmp_path):
    run_world(2, _abort_at_exit, str(tmp_path), 1)
    assert len(os.listdir(tmp_path)) == 2  # the first run crashed at exit, the second passed


def test_teardown_crash_twice_fails(tmp_path):
    with pytest.raises(AssertionError, match="(?s)teardown: every rank passed.*and again"):
        run_world(2, _abort_at_exit, str(tmp_path), 2)


def test_rank_failure_fails_at_once(tmp_path):
    with pytest.raises(AssertionError, match="rank 1 computed something wrong"):
        run_world(2, _fails_on_rank_1)
