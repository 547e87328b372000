"""The GSM8K math agent: a calculator tool, the answer after ``####``, a strict reward.

Deployable to ACR (the stack's ``deployMathAgent`` builds ``local/agents/Dockerfile`` with it). The system
prompt is the toolkit's Strands math agent's (``examples/strands_math_agent/rl_app.py`` in
agentcore-rl-toolkit); the loop is plain OpenAI tool calling with the official ``openai`` client against
``_rollout.base_url`` (the rollout gateway): the model may call ``calculator`` up to ``MAX_TOOL_ROUNDS``
times, then answers. The reward is strict, as in the toolkit's GSM8K examples (verl's
``gsm8k.compute_score`` strict mode): 1.0 only when the last ``#### <number>`` in the final answer equals
the ground truth, else 0.0.

As docs/agent-contract.md (section 2) says, the gateway's refusals end the rollout and the agent returns
what it has (`gateway_stop`): 401 (the rollout is over), 429 (its ``max_turns_per_rollout`` or
``max_tokens_per_rollout`` budget is spent) and 400 ``context_length_exceeded``. The result's
``stop_reason`` names it; any other error still raises (the rollout then fails, as a bug should).

Payload rows: ``{"prompt": question, "answer": "72"}`` (``prepare_gsm8k`` in the toolkit).
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from typing import Any

from agentcore_rl_toolkit import AgentCoreRLApp
from openai import APIStatusError, AuthenticationError, BadRequestError, OpenAI, RateLimitError

from local.agents._llm import llm_settings

app = AgentCoreRLApp()

SYSTEM_PROMPT = (
    "Your task is to solve the math problem. "
    + "Use the calculator tool to compute all mathematical expressions. "
    + 'Let\'s think step by step and output the final answer after "####".'
)
MAX_TOOL_ROUNDS = 8

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses) and return the result.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (3 * 68) + (2 * 80)"}},
            "required": ["expression"],
        },
    },
}

_ANSWER_RE = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression safely (no names, calls or attributes).

    Returns the result as text (integers without ``.0``) or ``"error: ..."``.
    """
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    try:
        value = ev(ast.parse(expression.replace(",", "").replace("^", "**").strip(), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError) as exc:
        return f"error: {exc}"
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    return str(value)


def extract_answer(text: str | None) -> str | None:
    """The number after the last ``####`` (commas and ``$`` removed), or None."""
    if not text:
        return None
    found = _ANSWER_RE.findall(text)
    return found[-1].replace(",", "") if found else None


def strict_reward(text: str | None, ground_truth: str) -> float:
    """1.0 when ``extract_answer(text)`` equals ``ground_truth`` numerically, else 0.0."""
    pred = extract_answer(text)
    if pred is None:
        return 0.0
    try:
        return 1.0 if abs(float(pred) - float(str(ground_truth).replace(",", ""))) < 1e-6 else 0.0
    except ValueError:
        return 1.0 if pred == str(ground_truth).strip() else 0.0


def gateway_stop(error: APIStatusError) -> str | None:
    """The stop reason when ``error`` is a gateway answer that ends the rollout (401, 429, 400
    ``context_length_exceeded``: docs/agent-contract.md section 2), else None (the error is raised)."""
    if isinstance(error, AuthenticationError):
        return f"gateway 401: the rollout is over ({error.message})"
    if isinstance(error, RateLimitError):
        return f"gateway 429: the rollout's budget is spent ({error.message})"
    if isinstance(error, BadRequestError) and error.code == "context_length_exceeded":
        return f"gateway 400 context_length_exceeded ({error.message})"
    return None


def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """Run the tool loop; returns ``{"rewards", "answer", "tool_calls", "turns", "stop_reason"}``. The loop ends
    with a reply without tool calls, after ``MAX_TOOL_ROUNDS`` tool rounds, or on a gateway refusal that ends
    the rollout (`gateway_stop`); the answer so far is scored."""
    client_kwargs, request = llm_settings(payload)
    client = OpenAI(**client_kwargs, max_retries=2, timeout=300)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": str(payload["prompt"])},
    ]
    tool_calls = turns = 0
    answer: str | None = None
    stop_reason = "end_turn"
    for _ in range(MAX_TOOL_ROUNDS + 1):
        try:
            completion = client.chat.completions.create(messages=messages, tools=[CALCULATOR_TOOL], **request)
        except APIStatusError as error:
            reason = gateway_stop(error)
            if reason is None:
                raise
            stop_reason = reason
            break
        turns += 1
        if not completion.choices:
            break
        message = completion.choices[0].message
        answer = message.content
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            tool_calls += 1
            try:
                args = json.loads(call.function.arguments or "{}")
                result = calculate(str(args.get("expression", ""))) if call.function.name == "calculator" \
                    else f"error: unknown tool {call.function.name!r}"
            except json.JSONDecodeError as exc:
                result = f"error: arguments are not JSON: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    else:
        stop_reason = f"tool rounds: the model still called tools after {MAX_TOOL_ROUNDS} rounds"
    return {"rewards": strict_reward(answer, str(payload.get("answer", ""))), "answer": answer, "tool_calls": tool_calls,
            "turns": turns, "stop_reason": stop_reason}


@app.rollout_entrypoint
def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    return solve(payload)


if __name__ == "__main__":
    app.run()
