"""How close the kit is to published measurements of real GPU runs (``data/published/``,
``kit.accuracy.published``): per table the rows the kit expresses of all, per measured quantity (max
allocated, max reserved, step time) the median |error| and the worst error with its row, the step times
within 25 % and within 2x, the stage-order sets ranked right, how many fit / OOM verdicts agree, the
report's wall time (pure estimation, no launch), and the same errors on the kit's own GPU runs
(``data/reference``, ``kit.accuracy.reference``) and on the allocator traces (``kit.accuracy.traces``:
the replay of each trace, exact or not, and the estimate's errors). The expressed count is a figure to
raise; the errors are a test set's, not a fit's (``data/published/README.md``).
"""

import time

from kit.accuracy import published, reference, traces


def main() -> None:
    start = time.perf_counter()
    report = published.report()
    wall = time.perf_counter() - start
    summary = report.summary()
    for table, counts in summary["tables"].items():
        print(f"published_{table}_expressed: {counts['expressed']}/{counts['rows']} rows")
    for quantity, q in summary["quantities"].items():
        by = "/".join(q["predicted_as"])
        print(f"published_{quantity}_rows: {q['rows']} rows (predicted by {by})")
        print(f"published_{quantity}_median_abs_error: {q['median_abs_error']:.3f} ratio")
        print(f"published_{quantity}_worst_error: {q['worst_error']:+.3f} ratio ({q['worst_id']})")
    step = summary["step_time"]
    if step:
        print(f"published_step_time_rows: {step['rows']} rows")
        print(f"published_step_time_median_abs_error: {step['median_abs_error']:.3f} ratio")
        print(f"published_step_time_worst_error: {step['worst_error']:+.3f} ratio ({step['worst_id']})")
        print(f"published_step_time_within_25pct: {step['within_25']}/{step['rows']} rows")
        print(f"published_step_time_within_2x: {step['within_2x']}/{step['rows']} rows")
        right = sum(g["agrees"] for g in step["stage_sets"])
        print(f"published_stage_order_right: {right}/{len(step['stage_sets'])} sets")
    fit = summary["fit"]
    disagree = f" (disagree: {', '.join(fit['disagree'])})" if fit["disagree"] else ""
    print(f"published_fit_agree: {fit['agree']}/{fit['rows']} rows{disagree}")
    print(f"published_fit_open: {len(fit['open'])} rows ({', '.join(fit['open']) or 'none'}: padded batches)")
    print(f"published_report_wall: {wall:.2f} s")
    own = reference.configurations()
    for quantity, q in reference.summary(own).items():
        print(f"reference_{quantity}_configurations: {q['configurations']} ({own[0].device})")
        print(f"reference_{quantity}_median_abs_error: {q['median_abs_error']:.3f} ratio")
        print(f"reference_{quantity}_worst_error: {q['worst_error']:+.3f} ratio ({q['worst']})")
    for run in traces.runs():
        replayed, errors = run.replayed, run.errors()
        exact = (replayed.max_reserved, replayed.max_allocated) == (run.max_reserved, run.max_allocated)
        print(f"trace_{run.name}_replay_exact: {exact} (rank 0 of {run.ranks}, {run.device})")
        for quantity in ("max_allocated", "max_reserved"):
            print(f"trace_{run.name}_{quantity}_error: {errors[quantity]:+.3f} ratio")
