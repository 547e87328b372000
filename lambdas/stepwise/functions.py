"""The Lambda function registry: one entry per function the stack deploys.

Read by the CDK stack (`infra/`) to create the functions and by the local engine
(`local/engine.py`) to dispatch invocations in-process, so the two cannot drift. The
state machine refers to a function as the placeholder ``${<Name>FunctionArn}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepwise.settings import (ENV_AGENT_RUNTIME_ARNS, ENV_BUCKET, ENV_DATA_BUCKETS, ENV_GATEWAY_URL,
                               ENV_JUDGE_MODEL_IDS, ENV_METRICS_NAMESPACE, ENV_SERVICE)


@dataclass(frozen=True)
class FunctionSpec:
    """One Lambda function.

    Attributes:
        name: logical name; the ASL placeholder is ``${{name}FunctionArn}``.
        handler: ``module.function`` of the handler inside the image.
        memory_mb: Lambda memory size in MB.
        timeout_s: Lambda timeout in seconds.
        description: what the function does (shown in the console).
        ephemeral_mb: its ``/tmp`` (Lambda ephemeral storage) in MB, 512 to 10,240 (512: Lambda's default).
        beside_loop: it produces what a person reads, beside the training loop (Track): the local stack
            runs it in a worker process of lower CPU priority than the loop's (`local.workers`), so the
            page never slows a step on the machine's few cores.
    """

    name: str
    handler: str
    memory_mb: int = 1024
    timeout_s: int = 300
    description: str = ""
    ephemeral_mb: int = 512
    beside_loop: bool = False


FUNCTIONS: tuple[FunctionSpec, ...] = (
    FunctionSpec("Init", "stepwise.handlers.init.handler", 2048, 900, "Validate config and datasets, create or resume the training session, write state.json"),
    FunctionSpec("PollSession", "stepwise.handlers.session.poll_handler", 512, 60, "Describe the training session until it is Running"),
    FunctionSpec("PlanStep", "stepwise.handlers.plan.handler", 1024, 300, "Choose the next generation batch of prompts and write the Map items"),
    FunctionSpec("StartRollout", "stepwise.handlers.rollout.start_handler", 512, 120, "Open a gateway session and invoke the agent on ACR"),
    FunctionSpec("OnRolloutResult", "stepwise.handlers.rollout.result_handler", 256, 60, "S3 result notification -> SendTaskSuccess"),
    FunctionSpec("FinishRollout", "stepwise.handlers.rollout.finish_handler", 1024, 300, "Extract the reward, replay captured turns into TraceRecords"),
    FunctionSpec("JudgeGroups", "stepwise.handlers.judge.handler", 512, 900, "Group judge on Bedrock: score each group's members against the rubric (runs only with a judge)"),
    FunctionSpec("ComputeAdvantages", "stepwise.handlers.advantages.handler", 2048, 900, "GRPO advantages, DAPO group filter, training datums"),
    FunctionSpec("AdmitGroups", "stepwise.handlers.groups.admit_handler", 512, 120, "admission group: start the groups that fit, one rollout-group execution each"),
    FunctionSpec("AwaitGroups", "stepwise.handlers.groups.await_handler", 512, 120, "admission group: store the trainer's task token; resume it when a batch of groups is ready"),
    FunctionSpec("RecordGroupComplete", "stepwise.handlers.advantages.group_handler", 1024, 300, "admission group: record a rolled-out group, wake the trainer, admit more groups"),
    FunctionSpec("RecordEval", "stepwise.handlers.advantages.eval_handler", 1024, 300, "Eval generation batch -> eval/accuracy"),
    FunctionSpec("SubmitTrain", "stepwise.handlers.train.submit_handler", 2048, 900, "forward_backward + optim_step + save_weights with write-ahead sequence numbers"),
    FunctionSpec("PollOperation", "stepwise.handlers.train.poll_handler", 512, 60, "Read training/sampling operation results"),
    FunctionSpec("Rebind", "stepwise.handlers.train.rebind_handler", 512, 300, "load_weights_for_sampling of the saved weights; commit the new sampler and policy version"),
    FunctionSpec("Checkpoint", "stepwise.handlers.train.checkpoint_handler", 512, 300, "save_state when due, final save and save_weights_at_end"),
    FunctionSpec("ContinueRun", "stepwise.handlers.session.continue_handler", 256, 60, "Continue the run as a new execution (state is in S3)"),
    FunctionSpec("StopSession", "stepwise.handlers.session.stop_handler", 512, 120, "Stop the training session (every terminal path)"),
    FunctionSpec("Cleanup", "stepwise.handlers.session.cleanup_handler", 512, 120, "EventBridge: execution aborted/timed out/failed -> stop the session"),
    FunctionSpec("SweepSessions", "stepwise.handlers.sweeper.handler", 512, 300, "Every few minutes: stop the training sessions of this stack that no execution drives"),
    # Track, sized from measurement (benchmarks/README.md section 10): publishing a step takes the same
    # requests at step 10 and 1,000 (about 1 CPU second with moto in process), and each tracker call has a
    # deadline (MLflow 60 s, W&B 75 s) inside the 300 s with 15 s to spare (a test holds the sum); /tmp
    # peaks at the run's tokenizer (copied, loaded, removed) plus ~35 KB of W&B files, removed after each
    # call (~1 KB of W&B's service log stays per call), so Lambda's default 512 MB. Memory: the image
    # rehearsal (scripts/image_rehearsal.py: the image's CPython 3.13 and wheels) measures a step's Track at
    # 258 MB peak; 2,048 MB stays for the CPU Lambda gives with it (about 1.2 vCPU: matplotlib's curves).
    FunctionSpec("Track", "stepwise.handlers.track.handler", 2048, 300, "S3 summary notification -> MLflow, W&B and the run report page (off the training loop)",
                 ephemeral_mb=512, beside_loop=True),
)

#: The function of the gateway image (``lambdas/Dockerfile.gateway``), not the handler image. It
#: has no Lambda handler: its ENTRYPOINT ``python3.13 -m stepwise.gateway`` runs ``handler`` (the web
#: server's ``main``) and the Lambda Web Adapter extension forwards invocations to that server.
#: Memory: the gateway is billed for every second a turn waits on the sampler (most of a step's stack
#: cost), so it gets what a turn needs, not more: 1,024 MB. Measured (``benchmarks/gateway_memory.py
#: --image``: the image's CPython 3.13 and locked wheels, streamed turns one at a time as one Lambda
#: environment serves them): 87 MB ready, 239 MB peak with the tiny model's tokenizer; a production
#: tokenizer adds ~100-200 MB. (2,048 MB before: twice the cost per turn.)
GATEWAY_FUNCTION = FunctionSpec(
    "Gateway", "stepwise.gateway.server.main", 1024, 900, "The agent's LLM endpoint: render, sample, capture turns"
)


def by_name(name: str) -> FunctionSpec:
    """The spec called ``name``. Raises KeyError naming the known functions."""
    for spec in FUNCTIONS:
        if spec.name == name:
            return spec
    raise KeyError(f"no Lambda function {name!r}; known: {', '.join(s.name for s in FUNCTIONS)}")




def environment(*, bucket: str, gateway_url: str, extra: dict[str, str] | None = None,
                data_buckets: str = "", agent_runtime_arns: str = "", judge_model_ids: str = "") -> dict[str, str]:
    """The environment every handler function gets (the stack and the local engine both use this).

    Args:
        bucket: the stack's run bucket (``STEPWISE_BUCKET``).
        gateway_url: the gateway's base URL (``STEPWISE_GATEWAY_URL``).
        extra: more variables, set last.
        data_buckets: comma-separated S3 bucket names besides ``bucket`` the functions are
            granted to read and write (``STEPWISE_DATA_BUCKETS``; CDK context ``dataBuckets``).
            '' = only ``bucket``.
        agent_runtime_arns: comma-separated ACR runtime ARNs StartRollout is granted to invoke
            (``STEPWISE_AGENT_RUNTIME_ARNS``; CDK context ``agentRuntimeArns``). '' = any
            runtime of the stack's region (``AWS_REGION``).
        judge_model_ids: comma-separated Bedrock models (ids, inference profile ids or ARNs) the group judge
            is granted to invoke (``STEPWISE_JUDGE_MODEL_IDS``; CDK context ``judgeModelIds``). '' = none.
    """
    env = {
        ENV_BUCKET: bucket,
        ENV_GATEWAY_URL: gateway_url,
        ENV_DATA_BUCKETS: data_buckets,
        ENV_AGENT_RUNTIME_ARNS: agent_runtime_arns,
        ENV_JUDGE_MODEL_IDS: judge_model_ids,
        ENV_SERVICE: "stepwise",
        ENV_METRICS_NAMESPACE: "Stepwise",
    }
    env.update(extra or {})
    return env
