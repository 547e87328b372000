"""The local stack: moto, the SageMaker simulator, the gateway, the ACR emulator and `run-local`."""

from pathlib import Path

#: The clone's root: datasets named in a config resolve against it; child processes start in it.
REPO_ROOT = Path(__file__).resolve().parent.parent
