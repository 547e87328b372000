"""The price table: every unit price the run's cost ledger and the cost estimate use, in one place.

AWS public on-demand list prices for ``REGION``, as published on ``PRICES_AS_OF`` (the AWS pricing
pages of Lambda, Step Functions, S3 and Amazon Bedrock AgentCore). They were read from stored
copies of those pages and other pages quoting them, not checked live from this machine: check your
region's prices before relying on a figure. Free tiers, Savings Plans and volume tiers are ignored
(the first tier's price is used throughout).

The SageMaker training session is not in the table: its price depends on the instance the service
gives the session, so the run's config names it (``session_usd_per_hour``); without it the ledger
counts session-hours only. Read by `stepwise.core.ledger` (the ledger in the run state and the
step summaries), `stepwise_cli.cost` (`stepwise cost`, `stepwise validate`), the local report and
the benchmarks. Pure constants: no I/O.
"""

from __future__ import annotations

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


def s3_request_class(operation: str) -> str | None:
    """``"put"`` or ``"get"``: the price class of an S3 API operation (botocore's operation name),
    or None for a free one (the DELETEs)."""
    if operation.startswith(S3_FREE_PREFIXES):
        return None
    return "put" if operation.startswith(S3_PUT_CLASS_PREFIXES) else "get"
