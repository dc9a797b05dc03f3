"""How close the kit is to published measurements of real GPU runs (``data/published/``,
``kit.estimate.published``): per table the rows the kit expresses of all, per measured quantity (max
allocated, max reserved) the median |error| and the worst error with its row, and how many fit / OOM
verdicts agree; the report's wall time beside (pure estimation, no launch). The expressed count is a figure
to raise; the errors are a test set's, not a fit's (``data/published/README.md``).
"""

import time

from kit.estimate import published


def main() -> None:
    start = time.perf_counter()
    report = published.report()
    wall = time.perf_counter() - start
    summary = report.summary()
    for table, counts in summary["tables"].items():
        print(f"published_{table}_expressed: {counts['expressed']}/{counts['rows']} rows")
        if counts["step_time_pending"]:
            print(f"published_{table}_step_time_pending: {counts['step_time_pending']} rows (issue 42)")
    for quantity, q in summary["quantities"].items():
        by = "/".join(q["predicted_as"])
        print(f"published_{quantity}_rows: {q['rows']} rows (predicted by {by})")
        print(f"published_{quantity}_median_abs_error: {q['median_abs_error']:.3f} ratio")
        print(f"published_{quantity}_worst_error: {q['worst_error']:+.3f} ratio ({q['worst_id']})")
    fit = summary["fit"]
    disagree = f" (disagree: {', '.join(fit['disagree'])})" if fit["disagree"] else ""
    print(f"published_fit_agree: {fit['agree']}/{fit['rows']} rows{disagree}")
    print(f"published_report_wall: {wall:.2f} s")
