"""The CDK stack of Stepwise RL (``infra.stack.StepwiseStack``) and the definition helpers.

Importing ``infra`` does not import the CDK: ``infra.definition`` (placeholders shared with
the local stack) and ``infra.settings`` are plain Python; ``infra.stack`` and the constructs
import ``aws_cdk``.
"""

from infra.definition import substitutions, synthesized_definition, synthesized_substitutions

__all__ = ["substitutions", "synthesized_definition", "synthesized_substitutions"]
