"""pytest plugin of ``make gpu-check`` (tools/gpu_check.py loads it with ``-p gpu_check_progress``).

With ``FAKEQUANT_GPU_CHECK_STATE=PREFIX`` set, each test's outcome is appended to ``PREFIX.done``
(``outcome<TAB>node id``, one line per test, flushed as it ends) and the test running is named
in ``PREFIX.current``, so that a step whose process dies (a segmentation fault in a C++
exception, a CUDA error that kills the context) still tells what ran, what failed and where it
died. Tests already in ``PREFIX.done`` are deselected, so that gpu_check.py resumes a run that
died after the test that killed it. Without the variable the plugin does nothing.
"""
import os

STATE = os.environ.get("FAKEQUANT_GPU_CHECK_STATE")
# a test's outcome is the worst of its phases (setup, call, teardown)
RANK = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 1, "failed": 2, "error": 3}
_outcomes = {}


def done_ids(prefix):
    """{node id: outcome} of the tests ``PREFIX.done`` lists."""
    try:
        with open(prefix + ".done") as f:
            lines = [line.rstrip("\n").split("\t", 1) for line in f if "\t" in line]
    except FileNotFoundError:
        return {}
    return {nodeid: outcome for outcome, nodeid in lines}


def pytest_collection_modifyitems(session, config, items):
    if not STATE:
        return
    done = done_ids(STATE)
    if not done:
        return
    keep = [item for item in items if item.nodeid not in done]
    dropped = [item for item in items if item.nodeid in done]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_runtest_logstart(nodeid, location):
    if STATE:
        with open(STATE + ".current", "w") as f:
            f.write(nodeid)


def pytest_runtest_logreport(report):
    if not STATE:
        return
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.when == "call":
        outcome = "xpassed" if hasattr(report, "wasxfail") else "passed"
    else:
        return
    previous = _outcomes.get(report.nodeid, "passed")
    _outcomes[report.nodeid] = outcome if RANK[outcome] >= RANK[previous] else previous


def pytest_runtest_logfinish(nodeid, location):
    if not STATE:
        return
    with open(STATE + ".done", "a") as f:
        f.write(f"{_outcomes.pop(nodeid, 'passed')}\t{nodeid}\n")
    with open(STATE + ".current", "w"):
        pass
