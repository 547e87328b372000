"""Fixtures shared across test folders (pytest finds them here; no test module imports them).

``stack``: the pipeline stack (moto S3 + Step Functions, the SageMaker simulator; ``tests/support/pipeline.py``),
one per test module, for the handler tests and drills. Modules that need another kind of stack
(the gateway's, the local stack's) define their own ``stack``, which overrides this one.

``moto_env`` and ``moto_dep``: a moto deployment for the operator commands (``tests/cli/``) and
the reference-config tests (``tests/config/``); the deployment's data and helpers are in
``tests/support/cli.py``. Imports are inside the fixtures, so collecting a folder that does not
use them (the 3.13 rehearsal's fast tests, say) does not import moto.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from tests.support.cli import BUCKET, DEFINITION, REGION, ROLE, MotoDeployment


@pytest.fixture
def moto_env(monkeypatch):
    """Moto for S3 and Step Functions (executions run), the deployment's variables cleared."""
    from moto import mock_aws

    for key in ("STEPWISE_BUCKET", "STEPWISE_STATE_MACHINE_ARN", "STEPWISE_GATEWAY_URL", "STEPWISE_STACK",
                "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_SFN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield


@pytest.fixture
def moto_dep(moto_env) -> MotoDeployment:
    """The bucket and the stand-in state machine (``tests/support/cli.py``'s ``DEFINITION``) on moto."""
    import boto3

    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    sfn = boto3.client("stepfunctions", region_name=REGION)
    arn = sfn.create_state_machine(name="stepwise-test-loop", definition=json.dumps(DEFINITION),
                                   roleArn=ROLE)["stateMachineArn"]
    return MotoDeployment(BUCKET, arn, s3, sfn)


@pytest.fixture(scope="module", autouse=True)
def environment_per_module(request):
    """Each test module starts from the environment the one before it started from: whatever a module left in
    ``os.environ`` (a stack whose stop did not run, a command that set a variable in-process) is put back after
    it and named in a warning, so the next module on the same pytest-xdist worker does not depend on the
    order ``--dist loadfile`` happened to choose (CI once saw ``STEPWISE_JUDGE_MODEL_IDS`` and
    ``POWERTOOLS_LOG_LEVEL`` cross from one module into another's expectations)."""
    import warnings

    before = dict(os.environ)
    yield
    changed = sorted(k for k in before.keys() | os.environ.keys()
                     if before.get(k) != os.environ.get(k) and not k.startswith(_SET_BY_IMPORTS))
    for key in changed:
        if before.get(key) is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before[key]
    if changed:
        warnings.warn(f"{request.node.nodeid} left the environment changed: {', '.join(changed)} (put back)",
                      stacklevel=1)


#: Variables pytest sets per test, and those a library sets for itself when first imported (torch's), which
#: are not a module's doing and stay.
_SET_BY_IMPORTS = ("PYTEST_CURRENT_TEST", "KMP_", "TORCHINDUCTOR_")


@pytest.fixture(autouse=True)
def nothing_left_billing(request):
    """After every test: each run that ended during it left no AgentCore runtime session active and no
    training session not stopped (``tests/support/billing.py``: local stacks report when they stop, the
    pipeline stacks' executions when ``wait_execution`` sees them end). A test that means to leave
    something billing is marked ``@pytest.mark.leaves_billing("why")``."""
    from tests.support import billing

    try:
        from local.stack import LocalStack
    except ImportError:  # a test environment without the local stack (the image rehearsal's fast tests)
        LocalStack = None
    if LocalStack is not None and billing.local_stack_stopped not in LocalStack.observers:
        LocalStack.observers.append(billing.local_stack_stopped)
    billing.begin()
    yield
    if request.node.get_closest_marker("leaves_billing") is None:
        left = billing.leaks()
        assert not left, "left billing after the run ended:\n" + "\n".join(left)


@pytest.fixture(scope="module")
def stack():
    """A pipeline :class:`tests.support.pipeline.Stack` for the module; stopped after it."""
    from tests.support.pipeline import Stack

    s = Stack()
    yield s
    s.stop()


# ---------------------------------------------------------------------------------------------
# The order of the modules: those with a whole local run (an ``e2e`` test) first.
#
# `make test` runs the suite on pytest-xdist workers, a module at a time (``--dist loadfile
# --no-loadscope-reorder``: a module's fixtures, such as its local run, are built once, on one
# worker), in this order. The longest modules first keeps a worker from starting a minutes-long run
# while the other worker runs out of work (longest processing time first). Within each group the
# order is pytest's own; a serial run keeps it too, so the two runs see the modules in one order.


def pytest_collection_modifyitems(session, config, items):
    heavy = {item.module.__name__ for item in items
             if item.get_closest_marker("e2e") is not None and getattr(item, "module", None) is not None}
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "__name__", "") not in heavy)


# ---------------------------------------------------------------------------------------------
# The end of the session: exit with pytest's status, without the interpreter's teardown.
#
# A full run once printed "814 passed" and then aborted with "terminate called without an active
# exception" (SIGABRT, exit 134) during the interpreter's teardown; three other full runs of the
# same tree exited 0. That is the known teardown crash of processes that load C++ libraries with
# threads of their own (torch, pyarrow; the NeMo Megatron-Bridge suite hit it, after all of its
# tests passed): their static destructors run while threads still use them. Every result is
# final and printed by then, so the session exits at once with its status; the threads still
# alive are listed before pytest's summary, so a log shows what was running.
# STEPWISE_TEST_FULL_TEARDOWN=1 keeps the interpreter's teardown (to reproduce the crash).

_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    # listed here, before pytest's summary, so that the summary stays the run's last line
    alive = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    if alive:
        print(f"\nthreads alive at the end ({len(alive)}): {', '.join(alive[:10])}", file=sys.stderr)
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if not _EXIT_STATUS or os.environ.get("STEPWISE_TEST_FULL_TEARDOWN"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[-1])
