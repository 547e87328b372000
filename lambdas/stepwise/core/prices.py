"""The price table: every unit price the run's cost ledger and the cost estimate use, in one place.

AWS public on-demand list prices for ``REGION``, as published on ``PRICES_AS_OF`` (the AWS pricing
pages of Lambda, Step Functions, S3, Amazon Bedrock AgentCore and Amazon Bedrock). They were read from stored
copies of those pages and other pages quoting them, not checked live from this machine: check your
region's prices before relying on a figure. Free tiers, Savings Plans and volume tiers are ignored
(the first tier's price is used throughout).

The SageMaker training session is priced by the run's config (``session_usd_per_hour``): the ledger
counts its seconds, and without the field it counts session-hours only. `SESSION_PRICES` says what to put
there, per base model, as of ``SESSION_PRICES_AS_OF``: AWS publishes no per-hour figure for training
sessions (searched that day: the Amazon SageMaker AI pricing page and the "Training session APIs" page of
the SageMaker AI developer guide name none), so each real model's entry is `SESSION_DEFAULT_USD_PER_HOUR`, a
deliberately high default the user must confirm from the account's bill (`SESSION_PRICE_HOWTO`); the local
simulator's models cost nothing. `stepwise models` shows the figure, `stepwise start` warns while a run
uses an unconfirmed default. Read by `stepwise.core.ledger` (the ledger in the run state and the
step summaries), `stepwise_cli.cost` (`stepwise cost`, `stepwise validate`), the local report and
the benchmarks. Pure constants: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

#: When and where these prices were read.
PRICES_AS_OF = "2026-12-01"
REGION = "us-east-1"

#: AWS Lambda: USD per GB-second of duration, by instruction set (first tier: 6 billion GB-s a month
#: for x86, 7.5 billion for Arm), and per request (both).
LAMBDA_USD_PER_GB_SECOND = {"x86_64": 0.0000166667, "arm64": 0.0000133334}
LAMBDA_USD_PER_REQUEST = 0.20 / 1_000_000

#: AWS Step Functions, Standard workflows: USD per state transition ($0.025 per 1,000), retries
#: included; the child executions of a Distributed Map (STANDARD) are billed the same way.
SFN_USD_PER_TRANSITION = 0.025 / 1_000

#: Amazon S3 Standard requests: PUT, COPY, POST and LIST ($0.005 per 1,000); GET, SELECT, HEAD and
#: every other request but DELETE ($0.0004 per 1,000). DELETE is free.
S3_USD_PER_PUT_CLASS = 0.005 / 1_000
S3_USD_PER_GET_CLASS = 0.0004 / 1_000
#: S3 API operations (botocore names) billed at the PUT-class price: PUT, COPY, POST and LIST requests
#: (``PutObject``, ``CopyObject``, ``CreateMultipartUpload``, ``ListObjectsV2``, ``PutBucket...``, ...).
#: DELETE requests are free; every other operation is GET-class.
S3_PUT_CLASS_PREFIXES = ("Put", "Copy", "Post", "List", "Create", "Complete", "Upload", "Restore")
S3_FREE_PREFIXES = ("Delete", "Abort")

#: Amazon Bedrock AgentCore Runtime: USD per vCPU-hour and per GB-hour, billed per second. AgentCore
#: bills the CPU a session actively uses (not while it waits on I/O, such as the LLM) and its peak
#: memory for the session's lifetime; a run's config says how many vCPUs and GB to count per
#: session-second (``acr_vcpus``, ``acr_memory_gb``).
ACR_USD_PER_VCPU_HOUR = 0.0895
ACR_USD_PER_GB_HOUR = 0.00945

#: Amazon Bedrock On-Demand text models (the group judge, `stepwise.core.judge`): USD per million input
#: tokens and per million output tokens, by foundation model id without its version suffix (the pricing
#: page quotes per 1,000 or per million tokens; these are per million). Cross-Region inference costs what the
#: source Region's on-demand price says ("no additional charge"); for the Claude 4.5 models a global
#: inference profile (``global.``) is about 10% below the geographic one (``us.``) quoted here, so the ledger
#: errs high there. Batch mode, prompt caching and Provisioned Throughput are not priced. A model not in
#: the table is priced by the run config's ``judge.usd_per_million_input_tokens`` / ``..._output_tokens``
#: (without them the ledger counts its tokens only).
BEDROCK_USD_PER_MILLION_TOKENS: dict[str, tuple[float, float]] = {
    "amazon.nova-micro-v1": (0.035, 0.14),
    "amazon.nova-lite-v1": (0.06, 0.24),
    "amazon.nova-pro-v1": (0.80, 3.20),
    "anthropic.claude-3-haiku-20240307-v1": (0.25, 1.25),
    "anthropic.claude-3-5-haiku-20241022-v1": (0.80, 4.00),
    "anthropic.claude-haiku-4-5-20251001-v1": (1.00, 5.00),
    "anthropic.claude-sonnet-4-5-20250929-v1": (3.00, 15.00),
}
#: The geographic prefixes of Bedrock's system-defined (cross-Region) inference profile ids.
BEDROCK_PROFILE_PREFIXES = ("us-gov.", "us.", "eu.", "apac.", "jp.", "au.", "ca.", "global.")


def bedrock_base_model(model_id: str) -> str:
    """The foundation model a Bedrock ``modelId`` names, without its version suffix: a foundation-model or
    system inference profile ARN, a profile id (``us.amazon.nova-micro-v1:0``) or a model id
    (``amazon.nova-micro-v1:0``) -> ``amazon.nova-micro-v1``; '' for an application inference profile
    (its model is not in its name)."""
    resource = model_id.rsplit("/", 1)[-1] if model_id.startswith("arn:") else model_id
    if ":application-inference-profile/" in model_id:
        return ""
    for prefix in BEDROCK_PROFILE_PREFIXES:
        if resource.startswith(prefix):
            resource = resource[len(prefix):]
            break
    return resource.split(":", 1)[0]


def bedrock_usd_per_million(model_id: str) -> tuple[float, float] | None:
    """``(input, output)`` USD per million tokens of ``model_id`` from `BEDROCK_USD_PER_MILLION_TOKENS`, or
    None when the table does not price it."""
    return BEDROCK_USD_PER_MILLION_TOKENS.get(bedrock_base_model(model_id))


#: The training session's price per hour, per base model (hub content name; the model id works too).
SESSION_PRICES_AS_OF = "2026-12-07"

#: USD per session-hour assumed where AWS publishes no figure: deliberately above what one 8-GPU H100
#: instance costs on AWS's own pages (the stored "Amazon EC2 Capacity Blocks for ML" pricing page: p5.48xlarge,
#: US East, $39.33 an hour), so a ``max_cost_usd`` computed with it ends a run early rather than late. Not a
#: price: replace it with your account's figure (`SESSION_PRICE_HOWTO`).
SESSION_DEFAULT_USD_PER_HOUR = 100.0

#: How to read the real figure from the account, the page `stepwise models` and `stepwise start` point to.
SESSION_PRICE_HOWTO = (
    "run a short first run (examples/aws/gsm8k.json caps it), then divide its day's SageMaker charges (Cost "
    "Explorer, service 'Amazon SageMaker', grouped by usage type; or the bill's SageMaker section) by the "
    "session-hours the run's ledger counted (stepwise watch's last line); docs/my-agent.md, 'What a session costs'")


@dataclass(frozen=True)
class SessionPrice:
    """What a training session of one base model costs per hour, and where the figure comes from.

    Attributes:
        usd_per_hour: USD per session-hour (``session_usd_per_hour``).
        confirmed: True when ``source`` is a published price (or the local simulator's nothing); False for
            `SESSION_DEFAULT_USD_PER_HOUR`, which the user must confirm.
        source: where the figure comes from, in words.
    """

    usd_per_hour: float
    confirmed: bool
    source: str


_UNPUBLISHED = SessionPrice(SESSION_DEFAULT_USD_PER_HOUR, False,
                            f"no public AWS figure as of {SESSION_PRICES_AS_OF}: a high default to confirm")
_SIMULATOR = SessionPrice(0.0, True, "the local SageMaker simulator (your CPU)")

#: Hub content name (and model id) -> `SessionPrice`. Models not named here get `_UNPUBLISHED` too.
SESSION_PRICES: dict[str, SessionPrice] = {
    "openai-reasoning-gpt-oss-20b": _UNPUBLISHED,
    "openai/gpt-oss-20b": _UNPUBLISHED,
    "stepwise-tiny": _SIMULATOR,
    "stepwise-tiny-gated": _SIMULATOR,
}


def session_price(model: str) -> SessionPrice:
    """The `SessionPrice` of a base model named by its hub content name, model id or hub-content ARN
    (``.../hub-content/HUB/Model/NAME[/VERSION]``); `SESSION_DEFAULT_USD_PER_HOUR` (unconfirmed) for any other."""
    parts = model.split("/")
    name = parts[3] if model.startswith("arn:") and len(parts) >= 4 else model
    return SESSION_PRICES.get(name, _UNPUBLISHED)


def is_unconfirmed_default(usd_per_hour: float | None) -> bool:
    """Whether a config's ``session_usd_per_hour`` is still the table's unconfirmed default."""
    return usd_per_hour is not None and usd_per_hour == SESSION_DEFAULT_USD_PER_HOUR


def s3_request_class(operation: str) -> str | None:
    """``"put"`` or ``"get"``: the price class of an S3 API operation (botocore's operation name),
    or None for a free one (the DELETEs)."""
    if operation.startswith(S3_FREE_PREFIXES):
        return None
    return "put" if operation.startswith(S3_PUT_CLASS_PREFIXES) else "get"
