"""Gateway: the agents' LLM endpoint, a Lambda behind a public Function URL that streams.

The image is ``lambdas/Dockerfile.gateway`` (the handler code plus the AWS Lambda Web Adapter
extension, which runs ``python -m stepwise.gateway --port 8080`` and proxies invocations to
it). The URL's auth type is NONE on purpose: agents in ACR call it with an OpenAI/Anthropic
client whose api key is the rollout's session id, and the gateway answers 401 unless that id
names a live session record (docs/agent-contract.md, section 2).
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.functions import function_role, image_code, log_group_for, suppress_lambda_role_findings
from stepwise.functions import GATEWAY_FUNCTION, environment

#: The port the web app listens on inside the container (Lambda Web Adapter's AWS_LWA_PORT).
GATEWAY_PORT = 8080


class Gateway(Construct):
    """The gateway function and its Function URL (``self.url``)."""

    def __init__(self, scope: Construct, id: str, *, bucket: s3.IBucket, log_retention_days: int,
                 reserved_concurrency: int | None = None) -> None:
        """``reserved_concurrency``: the function's reserved concurrent executions (None = unreserved;
        docs/deploy.md "Concurrency" says how many one step needs)."""
        super().__init__(scope, id)
        spec = GATEWAY_FUNCTION
        log_group = log_group_for(self, "Logs", log_retention_days)
        role = function_role(self, "Role", spec=spec, log_group=log_group)
        env = environment(bucket=bucket.bucket_name, gateway_url="")
        # Must agree with the URL's invoke mode below, or streamed completions are buffered.
        env["AWS_LWA_INVOKE_MODE"] = "response_stream"
        env["AWS_LWA_PORT"] = str(GATEWAY_PORT)
        self.function = lambda_.DockerImageFunction(
            self,
            "Function",
            code=image_code(file="Dockerfile.gateway"),
            description=spec.description[:256],
            memory_size=spec.memory_mb,
            timeout=Duration.seconds(spec.timeout_s),
            environment=env,
            role=role,
            log_group=log_group,
            tracing=lambda_.Tracing.ACTIVE,
            reserved_concurrent_executions=reserved_concurrency,
        )
        self.function_url = self.function.add_function_url(
            auth_type=lambda_.FunctionUrlAuthType.NONE,
            invoke_mode=lambda_.InvokeMode.RESPONSE_STREAM,
        )
        suppress_lambda_role_findings(self)

    @property
    def url(self) -> str:
        """The Function URL (``https://....lambda-url.REGION.on.aws/``; a token until deploy)."""
        return self.function_url.url
