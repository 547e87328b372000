"""The boundary: one module per AWS side effect (STYLE.md "Boundaries ... are each one small module").

- `runstore`: the S3 run store (JSON objects, conditional ``state.json`` writes);
- `sagemaker`: training sessions and their operations (create, describe, stop, submit, poll, drive);
- `agentcore`: the AgentCore Runtime control plane (GetAgentRuntime) and ``InvokeAgentRuntime``;
- `task_tokens`: Step Functions ``SendTaskSuccess`` for a rollout's task token, and the history length;
- `datasets`: reading dataset objects from S3;
- `s3_probe`: Init's read-only checks of S3 locations;
- `clients`: the botocore client configuration every boto3 client here uses;
- `tracking`: MLflow.

Everything pure about a run is in `stepwise.core`; these modules only talk to AWS.
"""
