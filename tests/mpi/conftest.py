"""Under mpiexec, one rank's failed test would leave the others waiting forever in the
next collective. Print the failure and abort the whole job instead."""
import sys

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        if world.size > 1:
            sys.stderr.write(f"\n=== rank {world.rank}: {item.nodeid} failed ({report.when}) ===\n"
                             f"{report.longreprtext}\n")
            sys.stderr.flush()
            world.Abort(1)


@pytest.hookimpl(trylast=True)   # after the terminal reporter is registered
def pytest_configure(config):
    """One rank reports; the others print nothing unless a test fails (the hook above)."""
    from mpi4py import MPI
    if MPI.COMM_WORLD.rank != 0:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)
