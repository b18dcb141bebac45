"""The suite's own distribution over pytest-xdist workers (conftest.py's groups)."""
import os

import pytest


def test_tests_that_share_a_resource_are_grouped_for_one_worker(request):
    """--dist loadgroup sends a group to one worker by a suffix of the test id; pytest 9.2 drops
    the suffix silently (pytest-xdist #1386) and the SLURM tests then share the cluster at once."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("one process (-n 0): no workers to group for")
    grouped = [item.nodeid for item in request.session.items if item.get_closest_marker("xdist_group")]
    if not grouped:
        pytest.skip("no grouped test selected")
    assert all("@" in nodeid for nodeid in grouped), grouped[:3]
