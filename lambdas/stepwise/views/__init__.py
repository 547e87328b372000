"""Everything a person reads of a run: one home, beside the loop, never in it.

The read side of Stepwise: the rollout view (`stepwise rollouts`), the report page and each step's
page (the Track function, `stepwise report`, run-local's ``report.html``) and the W&B sample table.
`stepwise.core` keeps the algorithm and the run's control; nothing here decides anything the loop does,
and nothing here re-derives what the loop decided: a step's groups, shaped rewards, advantages and
which groups were trained come from `stepwise.core.steps.compute_step`, the function ComputeAdvantages
trains with, called on the typed records the loop wrote (a property test holds the advantage shown
for every trained rollout to the one in its datum: ``tests/views/test_one_read_side.py``).

Modules, from the data up:

- `store`: typed reads through any store (the S3 `RunStore`, a local run folder), `Unreadable` for a
  damaged file (one line naming it);
- `steps`: a step's `StepView` (groups marked trained / filtered / surplus / untrained / eval) from
  `compute_step`; `rollout`: one rollout's conversation, trained spans and failure cause;
- `summary`: the lines about a whole run said the same everywhere (best model, session, cost);
- `columns`: the columns of a rollout row (terminal, page and W&B read one list: adding a column is one
  line there); `tables`: a step's sample table (JSON);
- `index`: the report index, the bounded summary of the run the page is drawn from (curves, failures,
  the newest steps, the trackers' outbox and lease); `page`: the HTML (adding a curve is one line in
  its `CURVE_PANELS`);
- `publish`: what the Track function does per summary, at a cost that does not grow with the step
  number; `run`: a whole run rebuilt from its objects (the CLI, a local run folder).

The package is in the Lambda images (the Track function runs it) and is pure but for `store`,
`publish` and `run`, which do their I/O through the store they are given.
"""
