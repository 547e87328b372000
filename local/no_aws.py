"""The local stack never calls AWS: every AWS client of its processes must reach one of its emulators.

Each service the handlers and the gateway call is pointed at an emulator on loopback through the
environment: moto's ``AWS_ENDPOINT_URL_*`` (`local.engine.endpoint_env`), the simulator's
(``AWS_ENDPOINT_URL_SAGEMAKER``, ``AWS_ENDPOINT_URL_SAGEMAKERTRAININGSESSIONRUNTIME`` and the SDK's
``SAGEMAKER_TRAINING_SESSION_ENDPOINT`` / ``..._RUNTIME_ENDPOINT``) and the ACR emulator's
(``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE``, ``..._CONTROL``) and the Bedrock emulator's (``AWS_ENDPOINT_URL_BEDROCK_RUNTIME``,
``AWS_ENDPOINT_URL_BEDROCK``: the group judge). botocore reads a service's variable when a
client is built (``botocore.configprovider.ConfiguredEndpointProvider``: the service-specific variable,
then ``AWS_ENDPOINT_URL``, then the shared config file; ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true``
ignores them all). A variable that did not reach a process leaves its client on the real regional
endpoint: a run once asked ``https://api.sagemaker.us-east-1.amazonaws.com/`` when the simulator's
variables were lost, and failed with a bare ``EndpointConnectionError`` (no network) or would have
been answered by AWS (a network, the user's credentials).

Two guards, so that cannot happen silently:

- `endpoint_problems`: what is missing from an environment for every service the code under
  ``lambdas/`` calls to reach an emulator on loopback (`LocalStack.start` refuses to start on any);
- `refusing_aws`: while it is active, a botocore request to a host that is not loopback raises
  `NotPointedAtEmulator` instead of leaving the machine (the run-local process: `local.engine.MotoServer`;
  the Lambda workers: `local.workers`; the gateway: ``python -m local.no_aws stepwise.gateway ...``;
  the agent apps: `local.agents.serve`).
  moto's in-process mocks (``mock_aws``) answer in botocore's ``before-send`` event, before any
  request is sent, so they are not affected.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import runpy
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError

#: The SDK's own endpoint variables (``sagemaker.train.training_session._endpoints``): its control-plane
#: and runtime clients pass them as ``endpoint_url``, so botocore's variables do not reach those two.
SDK_ENDPOINT_VARIABLES = ("SAGEMAKER_TRAINING_SESSION_ENDPOINT", "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT")
#: botocore clients the code under ``lambdas/`` builds, by boto3 service name (tests/local/test_no_aws.py
#: scans the code so a new one cannot be missed); `service_endpoint_variable` names each one's variable.
HANDLER_SERVICES = ("s3", "stepfunctions", "sagemaker", "sagemakertrainingsessionruntime", "bedrock-agentcore",
                    "bedrock-agentcore-control", "bedrock-runtime", "bedrock", "sns", "secretsmanager", "cloudformation")
#: botocore's switch that ignores every ``AWS_ENDPOINT_URL*`` variable (environment, then shared config).
IGNORE_ENDPOINTS_VARIABLE = "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"


class NotPointedAtEmulator(BotoCoreError):
    """A client of the local stack was about to call a real AWS endpoint (its emulator's endpoint
    variable did not reach it). A BotoCoreError, so the handlers' probes report it as a call that
    could not be made (e.g. Init's refusal: ``the base model cannot be looked up (...)``); botocore
    and the SageMaker SDK do not retry it."""

    fmt = ("the local stack did not point this client at its emulator: it was about to call {url} "
           "(a real AWS endpoint; the local stack calls only its emulators on loopback). The process's "
           "endpoint variables: {variables}")


def service_endpoint_variable(service: str) -> str:
    """``AWS_ENDPOINT_URL_<SERVICE ID>`` of a boto3 service name, as botocore derives it
    (``ConfiguredEndpointProvider._get_service_env_var_name``: e.g. ``stepfunctions`` -> ``..._SFN``,
    ``secretsmanager`` -> ``..._SECRETS_MANAGER``)."""
    from botocore.configprovider import ConfiguredEndpointProvider

    return ConfiguredEndpointProvider(full_config={}, scoped_config={}, client_name=service)._get_service_env_var_name()


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def required_variables() -> tuple[str, ...]:
    """Every variable that must name a loopback emulator for the handlers never to reach AWS."""
    return (*(service_endpoint_variable(s) for s in HANDLER_SERVICES), *SDK_ENDPOINT_VARIABLES)


def endpoint_problems(env: Mapping[str, str]) -> list[str]:
    """What in ``env`` would let a handler's client reach AWS: each required variable that is unset or not a
    loopback URL, and ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` set to true. ``[]`` = every client stays local."""
    problems = [f"{name} is {'unset' if not env.get(name) else repr(env[name]) + ', not a loopback URL'}"
                for name in required_variables() if not is_loopback(env.get(name, ""))]
    if env.get(IGNORE_ENDPOINTS_VARIABLE, "").strip().lower() == "true":
        problems.append(f"{IGNORE_ENDPOINTS_VARIABLE}=true makes botocore ignore every AWS_ENDPOINT_URL_* variable")
    return problems


# --------------------------------------------------------------------------------- the guard

_LOCK = threading.Lock()
_ACTIVE = 0
_ORIGINAL_SEND: Any = None


def _refusing_send(self: Any, request: Any) -> Any:
    if not is_loopback(request.url):
        variables = sorted(k for k in os.environ if k.startswith("AWS_ENDPOINT_URL") or k in SDK_ENDPOINT_VARIABLES)
        raise NotPointedAtEmulator(url=request.url, variables=", ".join(variables) or "none")
    return _ORIGINAL_SEND(self, request)


@contextlib.contextmanager
def refusing_aws() -> Iterator[None]:
    """Within the block, every botocore request of this process to a non-loopback host raises
    `NotPointedAtEmulator` (``botocore.httpsession.URLLib3Session.send`` is wrapped; nested blocks and
    threads share one wrapper, removed when the outermost block ends)."""
    install()
    try:
        yield
    finally:
        uninstall()


def install() -> None:
    """Start refusing non-loopback botocore requests in this process (see `refusing_aws`)."""
    global _ACTIVE, _ORIGINAL_SEND
    from botocore.httpsession import URLLib3Session

    with _LOCK:
        if _ACTIVE == 0:
            _ORIGINAL_SEND = URLLib3Session.send
            URLLib3Session.send = _refusing_send  # type: ignore[method-assign]
        _ACTIVE += 1


def uninstall() -> None:
    global _ACTIVE
    from botocore.httpsession import URLLib3Session

    with _LOCK:
        _ACTIVE -= 1
        if _ACTIVE == 0:
            URLLib3Session.send = _ORIGINAL_SEND  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    """``python -m local.no_aws MODULE [ARGS...]``: run ``MODULE`` as ``python -m MODULE ARGS...`` does,
    refusing AWS (the local stack's gateway process)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m local.no_aws MODULE [ARGS...]", file=sys.stderr)
        return 2
    from local._proc import die_with_parent

    die_with_parent()
    install()
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
