"""The local stack never calls AWS (`local.no_aws`): a client whose emulator endpoint did not reach it fails
saying the local stack did not point it at its emulator, in the run-local process, in a Lambda worker and
in the gateway's process; the stack's environment is complete for every service the handlers call.

The failure this guards against: two run-locals at once on a loaded machine, the simulator's environment
lost (`local.stack.SimulatorProcess`), Init's base-model check asked ``https://api.sagemaker.us-east-1.
amazonaws.com/`` and the run died of a bare ``EndpointConnectionError``.

Run as ``python -m local.no_aws tests.local.test_no_aws``, this module asks the real SageMaker hub (the
gateway process's case).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from local import no_aws
from local.no_aws import endpoint_problems, refusing_aws, required_variables, service_endpoint_variable

ROOT = Path(__file__).resolve().parents[2]
HUB = "https://api.sagemaker.us-east-1.amazonaws.com/"
NOT_POINTED = "the local stack did not point this client at its emulator"


@pytest.fixture
def no_simulator_env(monkeypatch):
    """The environment a handler had when the simulator's variables were lost: dummy credentials, a
    region, no SageMaker endpoint."""
    for key in [k for k in os.environ if k.startswith("AWS_ENDPOINT_URL") or k.startswith("SAGEMAKER_TRAINING")]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def _ask_the_hub(event=None, context=None) -> str:
    """What Init's base-model check says (`stepwise.aws.hub.base_model_problem`), as a string."""
    from stepwise.aws.hub import base_model_problem

    return str(base_model_problem("us-east-1", "stepwise-tiny"))


def test_a_client_left_on_aws_fails_naming_the_local_stack_and_sends_nothing(no_simulator_env, monkeypatch):
    from botocore.httpsession import URLLib3Session

    sent: list[str] = []
    monkeypatch.setattr(URLLib3Session, "send", lambda self, request: sent.append(request.url))  # the network
    with refusing_aws():
        answer = _ask_the_hub()
    assert NOT_POINTED in answer and HUB in answer, answer
    assert answer.startswith("the base model cannot be looked up (")  # Init's refusal, with the reason
    assert sent == []  # not one request left, not one retry
    with refusing_aws(), refusing_aws():  # nested: one wrapper, removed by the outermost block
        pass
    assert URLLib3Session.send is not no_aws._refusing_send


def test_loopback_endpoints_and_in_process_moto_mocks_still_answer(no_simulator_env):
    import boto3
    from moto import mock_aws
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        with refusing_aws():
            s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=f"http://{host}:{port}")
            s3.create_bucket(Bucket="loopback-answers")
            assert "loopback-answers" in [b["Name"] for b in s3.list_buckets()["Buckets"]]  # moto's state is shared
            with mock_aws():  # answers in botocore's before-send event: nothing is sent
                mocked = boto3.client("s3", region_name="us-east-1")
                mocked.create_bucket(Bucket="mocked-answers")
                assert "mocked-answers" in [b["Name"] for b in mocked.list_buckets()["Buckets"]]
    finally:
        server.stop()


def test_the_run_local_process_refuses_aws_while_its_moto_server_runs(no_simulator_env):
    """In-process handlers (``STEPWISE_LOCAL_WORKERS=0``, tests) and the runner itself."""
    from local import engine

    with engine.MotoServer():
        answer = _ask_the_hub()
    assert NOT_POINTED in answer and HUB in answer, answer


def test_the_local_stack_refuses_to_start_when_the_simulator_s_environment_is_lost(no_simulator_env, monkeypatch):
    from types import SimpleNamespace

    import local.stack
    from local.stack import LocalStack

    lost = SimpleNamespace(url="http://127.0.0.1:4002", env={}, stop=lambda: None,  # what the start-up race left
                           state=lambda: {"sessions": {}, "counters": {}})  # no session was created
    monkeypatch.setattr(local.stack, "SimulatorProcess", lambda **kwargs: lost)
    monkeypatch.setenv("STEPWISE_LOCAL_WORKERS", "0")
    before = dict(os.environ)
    stack = LocalStack(bucket="stepwise-no-aws-test")
    try:
        with pytest.raises(RuntimeError, match="did not point every client of its handlers at an emulator") as refused:
            stack.start(tps_limit=4)
    finally:
        stack.stop()
    assert "AWS_ENDPOINT_URL_SAGEMAKER is unset" in str(refused.value)
    assert "SAGEMAKER_TRAINING_SESSION_ENDPOINT is unset" in str(refused.value)
    assert stack.resources is None  # no function, no state machine: nothing could run
    assert dict(os.environ) == before


def test_a_handler_in_a_lambda_worker_is_refused_naming_the_local_stack(no_simulator_env, monkeypatch):
    from local import engine
    from local.workers import WorkerPool

    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    d = engine.LambdaDispatcher(workers=WorkerPool(1))
    try:
        d.register("hub", handler_path="test_no_aws._ask_the_hub", memory_mb=512, timeout_s=120, arn="arn:hub")
        payload, error = d.call("hub", {}, "RequestResponse")
    finally:
        d.workers.stop()
        d.stop_limits()
    assert error is None
    answer = json.loads(payload)
    assert NOT_POINTED in answer and HUB in answer, answer


def test_the_gateway_s_runner_refuses_aws_in_its_process(no_simulator_env):
    proc = subprocess.run([sys.executable, "-m", "local.no_aws", "tests.local.test_no_aws"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert NOT_POINTED in proc.stdout and HUB in proc.stdout, proc.stdout
    from local.gateway import GatewayProcess
    import inspect

    assert '"local.no_aws", "stepwise.gateway"' in inspect.getsource(GatewayProcess)  # the gateway runs under it


def test_an_agent_app_s_process_refuses_aws():
    """The ACR emulator's agent processes (``python -m local.agents.serve``) refuse AWS before loading the app."""
    from botocore.httpsession import URLLib3Session

    from local.agents import serve

    try:
        with pytest.raises(ImportError):
            serve.main(["local.agents.no_such_agent_module", "--port", "0"])
        assert URLLib3Session.send is no_aws._refusing_send
    finally:
        if URLLib3Session.send is no_aws._refusing_send:
            no_aws.uninstall()


# ------------------------------------------------------------------------------ the environment


def _services_built(source: str, where: str) -> tuple[set[str], list[str]]:
    """The boto3 service names a module passes to ``*.client(...)`` / ``*.resource(...)`` (first argument or
    ``service_name=``): string literals, or names bound to one at the module's top level. Any other
    argument is returned as ``FILE:LINE`` (the scan cannot tell the service, so it must not pass)."""
    tree = ast.parse(source)
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for t in node.targets if isinstance(t, ast.Name)}
    built, unknown = set(), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name not in ("client", "resource"):
            continue
        arg = next((k.value for k in node.keywords if k.arg == "service_name"), node.args[0] if node.args else None)
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            built.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in constants:
            built.add(constants[arg.id])
        else:
            unknown.append(f"{where}:{node.lineno}")
    return built, unknown


def test_the_scan_for_clients_finds_every_form_and_refuses_a_name_it_cannot_read():
    source = ('import boto3\nRUNTIME = "sagemakertrainingsessionruntime"\n'
              'a = boto3.client("s3")\nb = session.client(service_name="sns")\nc = boto3.resource("dynamodb")\n'
              'd = boto3.client(RUNTIME, region_name="x")\ne = boto3.client(pick())\nf = _client("not-a-service")\n')
    assert _services_built(source, "m.py") == ({"s3", "sns", "dynamodb", "sagemakertrainingsessionruntime"}, ["m.py:7"])


def test_every_service_the_lambdas_build_a_client_for_needs_an_emulator_endpoint():
    """A scan of the code under ``lambdas/`` (its syntax tree: literal names, module constants, ``service_name=``,
    ``resource(...)``): a new client must be added to `local.no_aws.HANDLER_SERVICES` (and pointed at an
    emulator), or the local stack could reach AWS; a client whose service the scan cannot read fails it."""
    from sagemaker.train.training_session._clients import _RUNTIME_SERVICE_NAME

    built = {_RUNTIME_SERVICE_NAME, "sagemaker"}  # the SDK's control-plane and runtime clients
    unknown: list[str] = []
    for path in sorted((ROOT / "lambdas" / "stepwise").rglob("*.py")):
        found, unread = _services_built(path.read_text(), str(path.relative_to(ROOT)))
        built |= found
        unknown += unread
    assert unknown == [], f"clients whose service the scan cannot read (name it with a literal or a constant): {unknown}"
    assert {"s3", "secretsmanager", "sagemakertrainingsessionruntime"} <= built  # the scan finds them
    assert built <= set(no_aws.HANDLER_SERVICES), built - set(no_aws.HANDLER_SERVICES)


def test_moto_s_endpoint_variables_are_botocore_s_names_for_its_services():
    from local.engine import MOTO_SERVICES

    assert {s: f"AWS_ENDPOINT_URL_{suffix}" for s, suffix in MOTO_SERVICES.items()} == \
        {s: service_endpoint_variable(s) for s in MOTO_SERVICES}


def _stack_env() -> dict[str, str]:
    """The variables the local stack's services export: moto's, the simulator's, the ACR emulator's and the Bedrock
    emulator's (their own code, on made-up loopback ports)."""
    from types import SimpleNamespace

    from local.acr import AcrEmulator
    from local.bedrock import BedrockEmulator
    from local.engine import endpoint_env
    from local.simulator import SimulatorHandle

    acr = AcrEmulator()
    acr.url = "http://127.0.0.1:4003"
    bedrock = BedrockEmulator()
    bedrock.url = "http://127.0.0.1:4004"
    simulator = SimulatorHandle(SimpleNamespace(account_id="123456789012", region="us-east-1"),
                                SimpleNamespace(server_address=("127.0.0.1", 4002)), None)
    return {**endpoint_env("http://127.0.0.1:4001"), **simulator.env, **acr.env, **bedrock.env}


def test_the_stack_s_environment_points_every_handler_service_at_loopback_and_a_lost_part_is_named():
    env = _stack_env()
    assert endpoint_problems(env) == []
    assert set(required_variables()) <= set(env)

    without_simulator = {k: v for k, v in env.items() if "SAGEMAKER" not in k}
    problems = endpoint_problems(without_simulator)
    assert "AWS_ENDPOINT_URL_SAGEMAKER is unset" in problems and "SAGEMAKER_TRAINING_SESSION_ENDPOINT is unset" in problems
    assert len(problems) == 4

    remote = {**env, "AWS_ENDPOINT_URL_SNS": "https://sns.us-east-1.amazonaws.com"}
    assert endpoint_problems(remote) == ["AWS_ENDPOINT_URL_SNS is 'https://sns.us-east-1.amazonaws.com', not a loopback URL"]
    ignored = {**env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "True"}
    assert endpoint_problems(ignored) == ["AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true makes botocore ignore every "
                                          "AWS_ENDPOINT_URL_* variable"]


def test_the_stack_s_environment_wins_over_a_shared_config_that_ignores_endpoint_variables(no_simulator_env, monkeypatch,
                                                                                          tmp_path):
    import boto3

    config = tmp_path / "config"
    config.write_text("[default]\nignore_configured_endpoint_urls = true\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER", "http://127.0.0.1:4002")
    assert boto3.Session().client("sagemaker", region_name="us-east-1").meta.endpoint_url.startswith("https://")
    from local.engine import endpoint_env

    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", endpoint_env("http://127.0.0.1:4001")[
        "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"])
    assert boto3.Session().client("sagemaker", region_name="us-east-1").meta.endpoint_url == "http://127.0.0.1:4002"


@pytest.mark.parametrize("url, loopback", [
    ("http://127.0.0.1:5000", True), ("http://localhost:1/x", True), ("http://127.8.9.1", True), ("http://[::1]:80", True),
    ("https://api.sagemaker.us-east-1.amazonaws.com/", False), ("http://10.0.0.1", False), ("", False),
    ("http://localhost.example.com", False), ("http://127.0.0.1.nip.io", False)])
def test_loopback_means_this_machine_only(url, loopback):
    assert no_aws.is_loopback(url) is loopback


if __name__ == "__main__":  # the gateway's process, `python -m local.no_aws tests.local.test_no_aws`
    print(_ask_the_hub())
