"""`stepwise probe-service`: ask a real training session what it does while it loads new weights.

What a SageMaker Training Session samples once ``loadWeightsForSampling`` bound a newer model package is
not documented, and a run's ``sampler_binding`` depends on it (`stepwise.core.sampler_binding`). This
command settles it on an account, with the smallest model the region offers, in at most
``--max-minutes`` (15): it creates its own training session (``stepwise-probe-*``), saves two model
packages (A: the base weights; B: after three optimizer steps), and

1. loads A, then B (each load timed), taking a greedy reference sample of each right after its load;
2. interleaves greedy samples naming A and naming B: what A answers now that B is loaded (served by
   A, refused, answered by B's weights, or by neither) says whether the service serves several packages;
3. loads A while long samples naming B run, loads B again and checks each spanning sample's logprobs
   against ``computeLogprobs`` on B: whether a load disturbs the samples in flight;
4. times short samples idle and while a ``forward_backward`` runs: whether sampling slows during a
   training operation.

It prints the loads' durations, the observations, the service's behaviour, the bindings safe against
it, and the line to put in a run config (``{"sampler_binding": ...}``, also in ``--json``). The session
is stopped on every path, Ctrl-C and SIGTERM included, and the two model packages are deleted (their
S3 artifacts stay under the session's output path). Exit code 0 when the behaviour was told, 1 when
the probe could not tell (the safe default ``turn_gate`` is then printed), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stepwise_cli.commands._runs import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

#: The probe's prompts: one a model answers at length (the long samples), one it answers greedily.
LONG_PROMPT = "Count from 1 to 5000, one number per line, with nothing else."
SHORT_PROMPT = "Name three colours."
#: The service's smallest maxTokens (botocore's ``SamplingParams.maxTokens``).
MIN_TOKENS = 512
#: Optimizer steps (learning rate 1e-2, the service's largest) between package A and package B: enough
#: for greedy samples of the two to differ beyond `stepwise.core.sampler_binding.MATCH_TOLERANCE`.
TRAIN_STEPS = 3


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="a run config (JSON or YAML): the probe uses its region, role_arn, "
                                         "model_package_group_arn, s3_output_path, kms_key_arn and vpc_config")
    parser.add_argument("--region", help="AWS region (default: the config's, else your AWS configuration)")
    parser.add_argument("--role-arn", help="the SageMaker execution role of the session (default: the config's)")
    parser.add_argument("--base-model", default="smallest",
                        help="base model id or hub ARN; 'smallest' (default) = the smallest ungated model the "
                             "region offers (by the parameter count in its id)")
    parser.add_argument("--model-package-group-arn", help="where the two packages are saved (default: the config's, "
                                                          "else the SDK's default group)")
    parser.add_argument("--s3-output-path", help="the session's output path (default: the config's, else the SDK's)")
    parser.add_argument("--max-minutes", type=float, default=15.0,
                        help="stop the probe (and its session) after this long, reporting what it saw (default 15)")
    parser.add_argument("--long-tokens", type=int, default=4096,
                        help=f"maxTokens of the long samples that span a load (default 4096, at least {MIN_TOKENS})")
    parser.add_argument("--samples", type=int, default=3,
                        help="samples of each kind per observation (default 3)")
    from stepwise_cli.grammar import add_json, add_out, add_set

    add_set(parser)

    add_json(parser, "the findings (with 'config': the fields to put in a run config) instead of the report lines")
    add_out(parser, "the findings as JSON to this file too")


def preparse(argv: list[str]) -> list[str]:
    """The old ``--json PATH`` (PATH not starting with ``-``), which wrote the findings' file before ``--out``
    did, as ``--out PATH``, with a deprecation warning (kept for one release); `stepwise_cli.main` calls it."""
    from stepwise_cli.grammar import warn_deprecated

    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == "--json" and not out[i + 1].startswith("-"):
            warn_deprecated(f"--json {out[i + 1]}", f"--out {out[i + 1]} (and --json to print the findings)")
            out[i:i + 2] = ["--out", out[i + 1]]
            break
    return out


# ---------------------------------------------------------------------------- the target


@dataclass
class Target:
    """Where the probe's session runs and what it trains."""

    region: str
    role_arn: str
    base_model: str
    model_package_group_arn: str = ""
    s3_output_path: str = ""
    kms_key_arn: str = ""
    vpc_config: dict[str, Any] | None = None


def model_size(model_id: str) -> float | None:
    """Billions of parameters named in a model id (``Qwen/Qwen3-0.6B`` -> 0.6, ``...-135M`` -> 0.135), or None."""
    m = re.findall(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*([BbMm])(?![A-Za-z])", model_id.replace("_", "-"))
    if not m:
        return None
    value, unit = m[-1]
    return float(value) / (1000.0 if unit in "Mm" else 1.0)


def smallest_model(models: list[Any]) -> Any:
    """The ungated model with the fewest parameters by `model_size` (unsized ones last, in the hub's order).

    Raises:
        ValueError: no ungated model.
    """
    open_ = [m for m in models if not m.gated]
    if not open_:
        raise ValueError("the region offers no base model without a license to accept; pass --base-model")
    return min(open_, key=lambda m: (model_size(m.model_id) is None, model_size(m.model_id) or 0.0))


def resolve_target(args: argparse.Namespace) -> Target:
    """The probe's target from the flags and ``--config``. Raises ValueError for what is missing."""
    import os

    cfg: dict[str, Any] = {}
    if args.config:
        from stepwise.config import read_config_file

        from stepwise_cli.grammar import parse_sets

        raw = read_config_file(args.config)
        cfg = {**raw, **parse_sets(getattr(args, "set", []))} if isinstance(raw, dict) else {}
    region = args.region or cfg.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ValueError("no region: pass --region (or a --config naming one, or set AWS_REGION)")
    role = args.role_arn or cfg.get("role_arn")
    if not role:
        raise ValueError("no role: pass --role-arn (the SageMaker execution role a run config names as role_arn)")
    base = args.base_model
    if base == "smallest":
        from stepwise.aws import hub

        base = smallest_model(hub.base_models(region)).model_id
    return Target(region=region, role_arn=role, base_model=base,
                  model_package_group_arn=args.model_package_group_arn or cfg.get("model_package_group_arn") or "",
                  s3_output_path=args.s3_output_path or cfg.get("s3_output_path") or "",
                  kms_key_arn=cfg.get("kms_key_arn") or "", vpc_config=cfg.get("vpc_config"))


# ---------------------------------------------------------------------------- the probe


class OutOfTime(RuntimeError):
    """The probe reached ``--max-minutes``."""


@dataclass
class Findings:
    """What the probe saw (also its ``--json``)."""

    session: str = ""
    base_model: str = ""
    region: str = ""
    loads: list[dict[str, Any]] = field(default_factory=list)
    distinct_packages: bool | None = None
    older_after_load: dict[str, Any] = field(default_factory=dict)
    across_load: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    behaviour: str = "unknown"
    safe_bindings: list[str] = field(default_factory=list)
    recommended: str = "turn_gate"
    complete: bool = False
    error: str = ""
    stopped: bool | None = None
    deleted_packages: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def conclude(self) -> None:
        from stepwise.core import sampler_binding as rules

        older = self.older_after_load.get("answer")
        across = self.across_load.get("answer")
        self.behaviour = rules.classify_service(older, across)
        self.safe_bindings = list(rules.SAFE_BINDINGS[self.behaviour])  # type: ignore[index]
        self.recommended = rules.recommended_binding(self.behaviour)  # type: ignore[arg-type]

    def as_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["config"] = {"sampler_binding": self.recommended}
        return out


class Probe:
    """One probe on one training session (`run_probe` drives it; tests drive it against the simulator).

    Args:
        target: where and what.
        deadline: monotonic seconds past which every wait gives up (`OutOfTime`).
        samples: samples of each kind per observation; long_tokens: maxTokens of the spanning samples.
        say: prints one line of progress.
        session_name: the session to create (default ``stepwise-probe-{8 hex}``).
    """

    def __init__(self, target: Target, *, deadline: float, samples: int = 3, long_tokens: int = 4096,
                 say: Callable[[str], None] = print, session_name: str | None = None) -> None:
        self.target = target
        self.deadline = deadline
        self.samples = max(1, samples)
        self.long_tokens = max(MIN_TOKENS, long_tokens)
        self.say = say
        self.findings = Findings(session=session_name or f"stepwise-probe-{uuid.uuid4().hex[:8]}",
                                 base_model=target.base_model, region=target.region)
        self.svc: Any = None
        self.rt: Any = None
        self.tc: Any = None
        self.packages: dict[str, str] = {}
        self._samplers: dict[str, Any] = {}

    # -------------------------------------------------------------- plumbing

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise OutOfTime("the probe reached --max-minutes")
        return left

    def service_client(self) -> Any:
        from sagemaker.train.training_session import ServiceClient

        t = self.target
        return ServiceClient(region=t.region, role_arn=t.role_arn, model_package_group_arn=t.model_package_group_arn or None,
                             s3_output_path=t.s3_output_path or None, kms_key_arn=t.kms_key_arn or None,
                             vpc_config=t.vpc_config)

    def sampler(self, arn: str) -> Any:
        """The SDK's ``SamplingClient`` naming ``arn`` (one per package: each holds a submitter thread)."""
        from sagemaker.train.training_session import SamplingClient

        if arn not in self._samplers:
            self._samplers[arn] = SamplingClient(self.findings.session, self.rt, model_package_arn=arn, service_client=None)
        return self._samplers[arn]

    def load(self, label: str, during: str = "idle") -> float:
        """loadWeightsForSampling of package ``label`` to its end; records and returns its seconds."""
        from stepwise.aws.sagemaker import is_transient

        arn = self.packages[label]
        t0 = time.monotonic()
        while True:
            try:
                op = self.rt.execute_sampling_operation(trainingSessionName=self.findings.session,
                                                        operationConfig={"loadWeightsForSampling": {"modelPackageArn": arn}})
                break
            except Exception as e:  # the service may still be binding a package just saved (503)
                if not is_transient(e):
                    raise
                self.remaining()
                time.sleep(1.0)
        while True:
            res = self.rt.get_sampling_operation_result(trainingSessionName=self.findings.session,
                                                        operationId=op["operationId"])
            if res["status"] not in ("Pending", "InProgress"):
                break
            self.remaining()
            time.sleep(0.2)
        seconds = time.monotonic() - t0
        if res["status"] != "Completed":
            raise RuntimeError(f"loading package {label} ended {res['status']}: {res.get('errorDetails', '')}")
        self.findings.loads.append({"package": label, "arn": arn, "seconds": round(seconds, 3), "during": during})
        self.say(f"  loaded {label} in {seconds:.1f} s{'' if during == 'idle' else f' ({during})'}")
        return seconds

    def greedy(self, label: str) -> tuple[list[int], list[float]] | None:
        """A greedy sample of the short prompt naming ``label`` ((tokens, logprobs)), or None when refused."""
        from sagemaker.train.training_session import SamplingParams

        try:
            seq = self.sampler(self.packages[label]).sample(
                prompt=self.short_ids, num_samples=1,
                sampling_params=SamplingParams(max_tokens=MIN_TOKENS, temperature=0.0, seed=7),
            ).result(timeout=self.remaining()).sequences[0]
        except OutOfTime:
            raise
        except Exception:
            return None
        return list(seq.tokens), list(seq.logprobs or [])

    # -------------------------------------------------------------- steps

    def start(self) -> None:
        from stepwise.aws.sagemaker import runtime

        self.svc = self.service_client()
        self.rt = runtime(self.target.region)
        self.say(f"creating training session {self.findings.session} ({self.target.base_model}, {self.target.region})")
        self.tc = self.svc.create_lora_training_client(self.target.base_model, rank=8, alpha=16,
                                                       training_session_name=self.findings.session)
        tok = self.tc.get_tokenizer()

        def ids(text: str) -> list[int]:
            chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
            return list(tok.encode(chat, add_special_tokens=False))

        self.short_ids, self.long_ids = ids(SHORT_PROMPT), ids(LONG_PROMPT)

    def save_packages(self) -> None:
        """A = the session's weights as created (the base model); B = after `TRAIN_STEPS` optimizer steps."""
        from sagemaker.train.training_session import AdamParams, Datum, ModelInput, TensorData

        self.packages["A"] = self.tc.save_weights_for_sampler(description="stepwise probe A").result(
            timeout=self.remaining()).model_package_arn
        target = self.short_ids + list(self.long_ids[-8:])
        datum = Datum(model_input=ModelInput.from_ints(target[:-1]),
                      loss_fn_inputs={"target_tokens": TensorData(data=target[1:], dtype="int64"),
                                      "weights": TensorData(data=[1.0] * (len(target) - 1))})
        for _ in range(TRAIN_STEPS):
            self.tc.forward_backward([datum], loss_fn="cross_entropy").result(timeout=self.remaining())
            self.tc.optim_step(AdamParams(learning_rate=1e-2)).result(timeout=self.remaining())
        self.packages["B"] = self.tc.save_weights_for_sampler(description="stepwise probe B").result(
            timeout=self.remaining()).model_package_arn
        self.say(f"  saved A {self.packages['A']}\n  saved B {self.packages['B']}")

    def older_after_load(self) -> None:
        """Loads A then B, a greedy reference of each; then samples naming A and B interleaved."""
        from stepwise.core import sampler_binding as rules

        self.load("A")
        ref_a = self.greedy("A")
        self.load("B")
        ref_b = self.greedy("B")
        if ref_a is None or ref_b is None:
            raise RuntimeError("a sample naming the package just loaded was refused")
        self.findings.distinct_packages = rules.sample_distance(*ref_a, *ref_b) > rules.MATCH_TOLERANCE
        if not self.findings.distinct_packages:
            self.say("  A and B sample alike: cannot tell which package served a sample")
            return
        from concurrent.futures import ThreadPoolExecutor

        labels = ["A", "B"] * self.samples
        with ThreadPoolExecutor(len(labels)) as pool:
            answers = list(pool.map(self.greedy, labels))
        older = [rules.older_outcome(s, ref_a, ref_b) for label, s in zip(labels, answers) if label == "A"]
        newer = [rules.older_outcome(s, ref_b, ref_a) for label, s in zip(labels, answers) if label == "B"]
        answer = rules.summarize_older(older)
        if any(o != "served" for o in newer):  # the package loaded last must serve its own samples
            answer = "garbage"
        self.findings.older_after_load = {"answer": answer, "older": older, "newer": newer}
        self.say(f"  a sample naming A once B is loaded: {', '.join(older)}")

    def across_load(self) -> None:
        """Long samples naming B (loaded) while A loads; then B again, and each spanning sample's logprobs
        checked with computeLogprobs on B."""
        from sagemaker.train.training_session import SamplingParams

        from stepwise.core import sampler_binding as rules

        sc = self.sampler(self.packages["B"])
        ends: dict[int, float] = {}
        results: dict[int, Any] = {}

        def wait(i: int, fut: Any) -> None:
            try:
                results[i] = fut.result(timeout=self.remaining()).sequences[0]
            except Exception as e:  # a failed sample is a disturbed one
                results[i] = e
            ends[i] = time.monotonic()

        futures = [sc.sample(prompt=self.long_ids, num_samples=1,
                             sampling_params=SamplingParams(max_tokens=self.long_tokens, temperature=1.0, seed=100 + i))
                   for i in range(self.samples)]
        for f in futures:  # accepted by the service before the load is sent
            f.operation_id  # noqa: B018  (resolves the submit)
        waiters = [threading.Thread(target=wait, args=(i, f), daemon=True) for i, f in enumerate(futures)]
        for w in waiters:
            w.start()
        time.sleep(0.1)
        load_started = time.monotonic()
        self.load("A", during="while long samples of B run")
        for w in waiters:
            w.join(timeout=self.remaining())
        spanning = [i for i in results if ends.get(i, 0.0) > load_started]
        self.load("B", during="to check the spanning samples")
        distances: list[float | None] = []
        for i in spanning:
            seq = results[i]
            if isinstance(seq, Exception):
                distances.append(None)
                continue
            computed = sc.compute_logprobs(self.long_ids + list(seq.tokens)).result(timeout=self.remaining())
            distances.append(rules.logprob_distance(list(seq.logprobs or []), computed[len(self.long_ids):]))
        answer = rules.summarize_across(distances)
        self.findings.across_load = {"answer": answer, "samples": len(results), "spanning": len(spanning),
                                     "distances": [None if d is None else round(d, 4) for d in distances]}
        self.say(f"  samples in flight across a load: {len(spanning)} of {len(results)} spanned it, "
                 f"{answer or 'none to judge'}")

    def training_contention(self) -> None:
        """Short greedy samples idle, then while a forward_backward runs."""
        from sagemaker.train.training_session import Datum, ModelInput, TensorData

        from stepwise.core import sampler_binding as rules

        def timed() -> float:
            t0 = time.monotonic()
            self.greedy("B")
            return time.monotonic() - t0

        idle = [timed() for _ in range(self.samples)]
        ids = (self.long_ids * 4)[:2048]
        datums = [Datum(model_input=ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": TensorData(data=ids[1:], dtype="int64"),
                                        "weights": TensorData(data=[1.0] * (len(ids) - 1))}) for _ in range(8)]
        t0 = time.monotonic()
        fb = self.tc.forward_backward(datums, loss_fn="cross_entropy")
        busy: list[float] = []
        while len(busy) < self.samples and not fb.done():
            busy.append(timed())
        fb.result(timeout=self.remaining())
        train_s = time.monotonic() - t0
        ratio, slowed = rules.slowed_by_training(idle, busy)
        self.findings.training = {"idle_s": [round(x, 3) for x in idle], "busy_s": [round(x, 3) for x in busy],
                                  "ratio": None if ratio != ratio else round(ratio, 3), "slowed": slowed,
                                  "train_op_s": round(train_s, 3)}
        self.say(f"  sampling during a training op ({train_s:.1f} s): " + (
            f"{ratio:.2f}x the idle latency ({'slowed' if slowed else 'not slowed'})" if busy
            else "the op ended before a sample could run beside it"))

    def run(self) -> Findings:
        self.start()
        self.save_packages()
        self.older_after_load()
        self.across_load()
        self.training_contention()
        self.findings.complete = True
        return self.findings

    def close(self) -> None:
        """Stop the session (idempotent; a session never created is fine) and delete the packages."""
        from botocore.exceptions import ClientError

        svc = self.svc or self.service_client()
        try:
            svc.stop_session(self.findings.session)
            self.findings.stopped = True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("ResourceNotFound", "ResourceNotFoundException"):
                self.findings.stopped = False
                self.findings.error = self.findings.error or f"could not stop {self.findings.session}: {e}"
                raise
            self.findings.stopped = True  # never created
        for label, arn in self.packages.items():
            with contextlib.suppress(Exception):
                svc.delete_model_package(arn)
                self.findings.deleted_packages.append(arn)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt while the probe runs (its ``finally`` stops the session)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _uninterruptible() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while the session is being stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def run_probe(target: Target, *, max_minutes: float = 15.0, samples: int = 3, long_tokens: int = 4096,
              say: Callable[[str], None] = print, session_name: str | None = None) -> tuple[Findings, bool]:
    """Run the probe to its end, its deadline or an interrupt; the session is stopped on every path.
    Returns ``(findings, interrupted)``."""
    started = time.monotonic()
    probe = Probe(target, deadline=started + max_minutes * 60, samples=samples, long_tokens=long_tokens, say=say,
                  session_name=session_name)
    interrupted = False
    try:
        with _sigterm_as_interrupt():
            probe.run()
    except KeyboardInterrupt:
        interrupted = True
        probe.findings.error = "interrupted"
    except Exception as e:  # reported with what was seen; the session is stopped below
        probe.findings.error = f"{type(e).__name__}: {e}"
    finally:
        with _uninterruptible():
            say(f"stopping training session {probe.findings.session}")
            probe.close()
    probe.findings.seconds = round(time.monotonic() - started, 1)
    probe.findings.conclude()
    return probe.findings, interrupted


def report_lines(f: Findings) -> list[str]:
    """The closing report (the loads, the observations, the verdict and the config line)."""
    lines = [f"service probe: session {f.session} ({f.base_model}, {f.region}), {f.seconds:.0f} s"
             + ("" if f.complete else f" - incomplete: {f.error}")]
    if f.loads:
        lines.append("  loads: " + ", ".join(f"{x['package']} {x['seconds']:.1f} s" for x in f.loads))
    older = f.older_after_load.get("answer")
    lines.append(f"  a sample naming the older package once the newer is loaded: {older or 'not observed'}")
    across = f.across_load
    lines.append("  samples in flight across a load: " + (
        f"{across.get('answer') or 'none spanned it'} ({across.get('spanning', 0)} of {across.get('samples', 0)})"
        if across else "not observed"))
    t = f.training
    if t:
        lines.append("  sampling during a training op: " + (
            f"{t['ratio']}x the idle latency, {'slowed' if t['slowed'] else 'not slowed'}" if t.get("busy_s")
            else "not measured (the op ended first)"))
    lines.append(f"  the service behaves: {f.behaviour}; safe: {', '.join(f.safe_bindings)}")
    lines.append(f"  stopped: {'yes' if f.stopped else 'NO - stop it: stepwise-probe session ' + f.session}")
    lines.append("put in the run config:")
    lines.append(json.dumps({"sampler_binding": f.recommended}))
    return lines


def run(args: argparse.Namespace) -> int:
    try:
        target = resolve_target(args)
    except ValueError as e:
        print(f"stepwise probe-service: {e}", file=sys.stderr)
        return EXIT_USAGE
    findings, interrupted = run_probe(target, max_minutes=args.max_minutes, samples=args.samples,
                                      long_tokens=args.long_tokens)
    if args.json:
        print(json.dumps(findings.as_json(), indent=2))
    else:
        print("\n".join(report_lines(findings)))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(findings.as_json(), fh, indent=2)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if findings.behaviour != "unknown" else EXIT_FAILED
