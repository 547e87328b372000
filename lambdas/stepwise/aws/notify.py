"""SNS: notices to the stack's notification topic (``STEPWISE_NOTIFICATION_TOPIC_ARN``), such as a
run's budget warning (`stepwise.core.stopping.record_checks`). A notice is best effort: it never
fails the handler that sends it."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

#: SNS's limit on a subject (the Publish API: at most 100 characters).
MAX_SUBJECT = 100


def publish(topic_arn: str, *, subject: str, message: str) -> bool:
    """Publish ``message`` to ``topic_arn`` (nothing when it is ''); True when published. Errors are
    logged, never raised."""
    if not topic_arn:
        return False
    try:
        import boto3

        from stepwise.aws.clients import client_config

        region = topic_arn.split(":")[3] or None
        boto3.client("sns", region_name=region, config=client_config()).publish(
            TopicArn=topic_arn, Subject=subject[:MAX_SUBJECT], Message=message)
        return True
    except Exception as e:  # a notice must never fail the run
        log.warning("could not publish to %s: %s: %s", topic_arn, type(e).__name__, e)
        return False
