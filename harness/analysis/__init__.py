"""From trial records to conclusions: statistics, table models and their renderers
(text, LaTeX, plots), paired comparisons, run reports and one-trial timelines.

See docs/design.md for how the wings stack."""
