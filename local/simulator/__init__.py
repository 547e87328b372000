"""SageMaker Training Sessions simulator: the real wire protocol in front of a tiny torch model.

Start it in-process (tests, the local stack)::

    from local.simulator import start_simulator
    with start_simulator() as sim:          # port 0 = a free loopback port
        os.environ.update(sim.env)          # or monkeypatch.setenv for each item
        svc = ServiceClient(role_arn=..., model_package_group_arn=..., s3_output_path=...)
        tc = svc.create_lora_training_client(base_model="stepwise-tiny")
        ...
        assert sim.counters["optim_step"] == 1
        assert sim.running_sessions() == []

or as a process: ``stepwise simulator --port 8765`` (prints the ``export`` lines). Any process
that has ``sim.env`` in its environment reaches it: the SDK through
``SAGEMAKER_TRAINING_SESSION_ENDPOINT`` / ``SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT`` and
its Hub/model-registry lookups through ``AWS_ENDPOINT_URL_SAGEMAKER``; raw boto3 runtime
clients through ``AWS_ENDPOINT_URL_SAGEMAKERTRAININGSESSIONRUNTIME``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from local.simulator.faults import Fault
from local.simulator.service import BASE_MODEL_NAME, Simulator

__all__ = ["BASE_MODEL_NAME", "Fault", "SimulatorHandle", "TOY_RECIPE", "start_simulator"]

#: Dummy credentials/region used when the caller's environment has none.
_DEFAULT_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-west-2",
    "AWS_REGION": "us-west-2",
}


class SimulatorHandle:
    """A running simulator: ``url``, ``env``, ``counters``, fault controls, ``stop()``.

    ``counters`` is a snapshot dict: operations *applied*, by kind (``forward``,
    ``forward_backward``, ``optim_step``, ``save_weights``, ``save_state``, ``load_state``,
    ``sample``, ``compute_logprobs``, ``load_weights_for_sampling``; plus
    ``sampled_sequences``), and API calls received, by botocore operation name
    (``CreateTrainingSession``, ``StopTrainingSession``, ``ExecuteTrainingOperation``, ...).
    Missing keys read as absent, so use ``counters.get(kind, 0)``.
    """

    def __init__(self, simulator: Simulator, server: Any, thread: Any) -> None:
        self.simulator = simulator
        self._server = server
        self._thread = thread
        host, port = server.server_address[:2]
        self.port: int = port
        self.url = f"http://{host}:{port}"
        env = {
            "SAGEMAKER_TRAINING_SESSION_ENDPOINT": self.url,
            "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT": self.url,
            "AWS_ENDPOINT_URL_SAGEMAKER": self.url,
            "AWS_ENDPOINT_URL_SAGEMAKERTRAININGSESSIONRUNTIME": self.url,
        }
        # Dummy credentials/region only where the environment has none: the caller's own
        # values are never copied (``env`` gets printed by `stepwise simulator`).
        for key, value in _DEFAULT_ENV.items():
            if not os.environ.get(key):
                env[key] = value
        if os.environ.get("AWS_DEFAULT_REGION") and not os.environ.get("AWS_REGION"):
            env["AWS_REGION"] = os.environ["AWS_DEFAULT_REGION"]
        self.env: dict[str, str] = env
        self.region = env.get("AWS_REGION") or os.environ["AWS_REGION"]
        self.role_arn = f"arn:aws:iam::{simulator.account_id}:role/StepwiseSimulatorRole"
        self.model_package_group_arn = (
            f"arn:aws:sagemaker:{simulator.region}:{simulator.account_id}:model-package-group/stepwise-local"
        )
        self.s3_output_path = "s3://stepwise-simulator/output"

    # -------------------------------------------------------------- state

    @property
    def counters(self) -> dict[str, int]:
        return self.simulator.counters

    def reset_counters(self) -> None:
        self.simulator.reset_counters()

    def running_sessions(self) -> list[str]:
        """Sessions not yet stopped (Created/Scheduled/Running); tests assert ``== []``."""
        return self.simulator.running_sessions()

    def session_statuses(self) -> dict[str, str]:
        return self.simulator.session_statuses()

    def sampling_in_flight(self, session: str | None = None) -> int:
        """Sampling operations (not loads) accepted and not yet answered, in ``session`` or every session."""
        return self.simulator.sampling_in_flight(session)

    def session_seconds(self) -> dict[str, dict[str, float | None]]:
        """Per session: ``created``, ``stop_requested``, ``ended`` and the ``seconds`` it served (creation
        to the stop request; `local.simulator.service.Simulator.session_seconds`)."""
        return self.simulator.session_seconds()

    # -------------------------------------------------------------- drills

    def inject_fault(self, fault: Fault | str) -> None:
        """Arm a fault, e.g. ``"throttle:ExecuteTrainingOperation:2"`` (see ``faults.py``)."""
        self.simulator.faults.add(fault)

    def set_latency(self, target: str, seconds: float) -> None:
        """Delay an operation kind (``optim_step``, ``sample``, ...) or API name by ``seconds``."""
        self.simulator.faults.set_latency(target, seconds)

    def grant_sessions(self, pattern: str | None) -> None:
        """Refuse, as IAM would, calls naming a training session outside ``pattern`` (fnmatch, like the
        stack's grant ``training-session/stepwise-*``) with AccessDeniedException; None = every name."""
        self.simulator.granted_sessions = pattern

    def seed_model_packages(self, session_name: str, n: int) -> list[str]:
        """Register ``n`` model packages of the session's current weights (a long run's packages, for
        retention drills); returns their ARNs in creation order."""
        return self.simulator.seed_model_packages(session_name, n)

    def clear_faults(self) -> None:
        """Disarm every fault and latency."""
        self.simulator.faults.clear()

    def set_session_start(self, mode: str = "ok", seconds: float | None = None) -> None:
        """How sessions created from now on start: ``ok``, ``hang`` (never Running), ``fail``."""
        if mode not in ("ok", "hang", "fail"):
            raise ValueError(f"session start mode must be ok, hang or fail, got {mode!r}")
        self.simulator.session_start = mode
        if seconds is not None:
            self.simulator.session_start_seconds = float(seconds)

    def set_not_ready(self, *, warmup_seconds: float | None = None, binding_seconds: float | None = None) -> None:
        """How long the runtime answers 503 after a session turns Running (``warmup_seconds``) and
        sampling a model package answers 503 after it was saved (``binding_seconds``); 0 = never."""
        if warmup_seconds is not None:
            self.simulator.warmup_seconds = float(warmup_seconds)
        if binding_seconds is not None:
            self.simulator.binding_seconds = float(binding_seconds)

    def set_serving(self, mode: str | None, *, session: str | None = None, contention_seconds: float | None = None) -> None:
        """What a session samples once it loaded new weights (``several``, ``latest``, ``switching``,
        ``disturbing``: `local.simulator.service`), for the sessions' next samples: every session's, or
        with ``session`` that one's (now or once it is created; None: the simulator's again);
        ``contention_seconds`` slows each sampling
        operation that runs while a training operation of its session runs."""
        from local.simulator.service import check_serving

        if session is not None:
            self.simulator.set_session_serving(session, mode)
            if contention_seconds is not None:
                self.simulator.set_session_contention(session, contention_seconds)
            return
        if mode is not None:
            self.simulator.serving = check_serving(mode)
        if contention_seconds is not None:
            self.simulator.sampling_contention_seconds = float(contention_seconds)

    def expire_session(self, name: str) -> None:
        """Move the session ``name`` to ``Expired`` now (see also the ``expire`` fault)."""
        self.simulator.expire_session(name)

    def set_result_wait(self, seconds: float) -> None:
        """How long Get*OperationResult waits for completion before answering (long poll)."""
        self.simulator.result_wait_seconds = float(seconds)

    @contextlib.contextmanager
    def environ(self) -> Iterator[dict[str, str]]:
        """Set ``env`` in ``os.environ`` for the ``with`` block, restoring it afterwards."""
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            yield self.env
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def export_lines(self) -> list[str]:
        return [f"export {k}={v}" for k, v in self.env.items()]

    # -------------------------------------------------------------- lifecycle

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.simulator.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "SimulatorHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_simulator(
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    faults: list[str | Fault] | None = None,
    latency: dict[str, float] | None = None,
    verbose: bool = False,
    **options: Any,
) -> SimulatorHandle:
    """Start the simulator on ``host:port`` (0 = a free port) in a background thread.

    Options (``Simulator``): ``region``, ``account_id``, ``result_wait_seconds`` (long-poll,
    default 5), ``session_start_seconds`` / ``session_stop_seconds`` (default 0),
    ``session_start`` (``ok`` | ``hang`` | ``fail``), ``warmup_seconds`` / ``binding_seconds`` (503
    answers after Running / after a save, default 0), ``sampling_workers`` (default 2),
    ``fault_seed``, ``torch_threads`` (default 1, set process-wide; None leaves torch's),
    ``state_dir`` (keep model packages on disk there, so a restarted simulator still has them),
    ``serving`` (what a session samples once it loaded new weights: ``several`` (default), ``latest``,
    ``switching`` or ``disturbing``; `local.simulator.service`), ``sampling_contention_seconds`` (added to
    a sampling operation that runs while a training operation runs, default 0). ``faults``: specs like ``"throttle:ExecuteTrainingOperation:2"``;
    ``latency``: ``{"optim_step": 0.5, ...}``.
    """
    from local.simulator.server import SimulatorHTTPServer, serve_in_thread

    simulator = Simulator(**options)
    for fault in faults or []:
        simulator.faults.add(fault)
    for target, seconds in (latency or {}).items():
        simulator.faults.set_latency(target, seconds)
    server = SimulatorHTTPServer((host, port), simulator, verbose=verbose)
    thread = serve_in_thread(server)
    return SimulatorHandle(simulator, server, thread)

#: The configuration that learns the toy task in ~15-25 GRPO steps of 8 prompts x 8
#: responses (tests/simulator/test_toy_grpo_learns.py pins it; examples/toy.json uses the same LoRA and
#: learning rate).
TOY_RECIPE: dict[str, Any] = {
    "lora_rank": 8,
    "lora_alpha": 16,
    # LoRA wants a larger step than full fine-tuning (Schulman et al. 2025, "LoRA Without
    # Regret": ~10x): 2e-4 reached only ~0.4 in 20 steps, 2e-3 ~0.95 (tests/simulator/test_learning.py).
    "learning_rate": 1e-3,
    "loss": "importance_sampling",
    "temperature": 1.0,
    "max_tokens": 512,  # the service's minimum; the model ends its answer after ~2 tokens
}
