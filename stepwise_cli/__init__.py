"""The operator CLI (`stepwise`): its subcommands, the cost model, the run follower.

A top-level package beside ``lambdas/stepwise/``, so it is not copied into the Lambda images
(their Dockerfiles copy only ``lambdas/stepwise/``). The entry point is ``stepwise_cli.main:main``.
"""
