"""`stepwise.views.page.svg_chart` from several threads at once (the local stack runs several Track
invocations on threads of one worker process): matplotlib is not thread-safe (its mathtext parser drew a
symlog axis's ``$\\mathdefault{0}$`` tick label with a ``ValueError`` under concurrent use), so the charts
are drawn one at a time and every thread gets the page a lone thread gets."""

from __future__ import annotations

import threading

from stepwise.views.page import svg_chart

LINES = [("time/rollout_duration_p50", "duration p50 (s)", "line", [(s, 0.1 * s * s) for s in range(20)]),
         ("time/rollout_duration_p95", "duration p95 (s)", "dashed", [(s, 0.3 * s * s) for s in range(20)])]


def test_charts_drawn_on_many_threads_at_once_equal_one_drawn_alone():
    alone = svg_chart("per rollout", LINES, "per rollout (symlog)")
    got: list[str] = []
    errors: list[BaseException] = []

    def draw() -> None:
        try:
            for _ in range(3):
                got.append(svg_chart("per rollout", LINES, "per rollout (symlog)"))
        except BaseException as e:  # noqa: BLE001 (collected, asserted below)
            errors.append(e)

    threads = [threading.Thread(target=draw) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(got) == 18 and all(svg == alone for svg in got)
