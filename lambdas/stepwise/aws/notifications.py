"""SNS notifications from the handlers (the session sweeper's report). The stack's other
notifications (run ends, alarms) are EventBridge rules and CloudWatch alarm actions."""

from __future__ import annotations

from typing import Any

#: SNS limits: Subject up to 100 printable ASCII characters, Message up to 256 KB.
MAX_SUBJECT = 100
MAX_MESSAGE_BYTES = 256 * 1024


def publish(sns: Any, topic_arn: str, subject: str, message: str) -> str:
    """Publish ``message`` (cut to SNS's 256 KB) under ``subject`` (cut to 100 characters) to
    ``topic_arn``; returns the MessageId."""
    body = message.encode()[:MAX_MESSAGE_BYTES].decode(errors="ignore")
    return str(sns.publish(TopicArn=topic_arn, Subject=subject[:MAX_SUBJECT], Message=body)["MessageId"])
