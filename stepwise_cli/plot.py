"""The run's plot: mean training reward and eval accuracy per step (with the cost ledger's running
total on a second axis), and the behaviour metrics.

One figure for `stepwise watch --plot` and `stepwise run-local`'s ``reward.png``
(`plot_run`). The series drawn are stored in the PNG's text chunk ``stepwise-curves``
(`CURVES_KEY`), read back from the drawn lines, so a test reads what the figure shows.
matplotlib (Agg) is imported only when a figure is drawn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stepwise_cli.commands._runs import BEHAVIOUR_METRICS, eval_accuracy, mean_reward, metric

CURVES_KEY = "stepwise-curves"


def curves(steps: dict[int, dict[str, Any]], evals: dict[int, dict[str, Any]]
           ) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """``(reward per step, eval accuracy per eval step)`` from the step and eval summaries
    (``{step: summary}``), in step order."""
    rewards = [(s, r) for s in sorted(steps) if (r := mean_reward(steps[s])) is not None]
    accuracies = [(s, a) for s in sorted(evals) if (a := eval_accuracy(evals[s])) is not None]
    return rewards, accuracies


def behaviour_curves(steps: dict[int, dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """``{summary key: [(step, value), ...]}`` of the `BEHAVIOUR_METRICS` a step summary reports."""
    out: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(steps):
        summary = steps[step]
        n = metric(summary, "sampler/num_rollouts")
        errors, timeouts = metric(summary, "rollouts/num_error"), metric(summary, "rollouts/num_timeout")
        derived = {"rollouts/failed_fraction": (errors + timeouts) / n if n and errors is not None
                   and timeouts is not None else None}
        for key in (m.key for m in BEHAVIOUR_METRICS):
            value = derived[key] if key in derived else metric(summary, key)
            if value is not None:
                out.setdefault(key, []).append((step, value))
    return out


def cost_curve(steps: dict[int, dict[str, Any]]) -> list[tuple[int, float]]:
    """The cost ledger's running total (``cost/total_usd``, USD) at the end of each step that reports it."""
    return [(s, v) for s in sorted(steps) if (v := metric(steps[s], "cost/total_usd")) is not None]


def write_plot(path: Path, rewards: list[tuple[int, float]], evals: list[tuple[int, float]], title: str,
               behaviour: dict[str, list[tuple[int, float]]] | None = None,
               cost: list[tuple[int, float]] | None = None) -> Path:
    """A PNG of mean training reward per step (line) and eval accuracy (squares; step 0 is the
    baseline before training), with ``cost`` (`cost_curve`: the run's total USD after each step)
    dotted on a right-hand axis, and, given ``behaviour`` (`behaviour_curves`), a second panel of
    the behaviour metrics per step: per-rollout amounts and seconds on the left (symlog), fractions
    on the right.

    The series drawn are read back from the figure's lines and stored as JSON in the PNG text
    chunk ``stepwise-curves``: ``{"reward": [[step, value], ...], "eval_accuracy": [...],
    "cost_total_usd": [...], "behaviour": {summary key: [[step, value], ...]}}``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    two = behaviour is not None
    fig, axes = plt.subplots(2 if two else 1, 1, figsize=(8, 8.5 if two else 4), sharex=two, squeeze=False)
    ax = axes[0][0]
    drawn: dict[str, Any] = {"reward": [], "eval_accuracy": []}
    if rewards:
        (line,) = ax.plot([s for s, _ in rewards], [r for _, r in rewards], marker=".", label="mean training reward")
        drawn["reward"] = line.get_xydata().tolist()
    if evals:
        (line,) = ax.plot([s for s, _ in evals], [a for _, a in evals], "s", label="eval accuracy")
        drawn["eval_accuracy"] = line.get_xydata().tolist()
    ax.set_ylabel("reward / accuracy")
    ax.grid(alpha=0.3)
    handles = ax.get_lines()
    if cost:
        usd_axis = ax.twinx()
        (line,) = usd_axis.plot([s for s, _ in cost], [v for _, v in cost], ":", color="C3",
                                label="cost so far (USD, right)")
        usd_axis.set_ylabel("USD (cost ledger)")
        usd_axis.set_ylim(bottom=0)
        drawn["cost_total_usd"] = line.get_xydata().tolist()
        handles = [*handles, line]
    if handles:
        ax.legend(handles=handles, loc="upper left")
    ax.set_title(title)
    if two:
        drawn["behaviour"] = {}
        left = axes[1][0]
        right = left.twinx()
        handles = []
        for key, _, _, label, axis in BEHAVIOUR_METRICS:
            points = (behaviour or {}).get(key)
            if not points:
                continue
            target = left if axis == "count" else right
            (line,) = target.plot([s for s, _ in points], [v for _, v in points], marker=".",
                                  linestyle="-" if axis == "count" else "--", label=label,
                                  color=f"C{len(handles) % 10}")
            drawn["behaviour"][key] = line.get_xydata().tolist()
            handles.append(line)
        left.set_yscale("symlog", linthresh=1.0)
        left.set_ylabel("per rollout (symlog): turns, tool calls, tokens, seconds")
        right.set_ylim(-0.02, 1.02)
        right.set_ylabel("fraction (dashed)")
        left.grid(alpha=0.3)
        left.set_title("behaviour per step")
        if handles:
            left.legend(handles=handles, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={CURVES_KEY: json.dumps(drawn)})
    plt.close(fig)
    return path


def plot_run(path: Path, steps: dict[int, dict[str, Any]], evals: dict[int, dict[str, Any]], title: str) -> Path:
    """`write_plot` of a run's step and eval summaries (``{step: summary}``): its `curves`, its
    `behaviour_curves` and its `cost_curve`."""
    rewards, accuracies = curves(steps, evals)
    return write_plot(path, rewards, accuracies, title, behaviour_curves(steps), cost_curve(steps))
