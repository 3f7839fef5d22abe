"""Benchmarks that print figures against their targets (runtime hot paths, scaling, trial
throughput). Nothing here is a test.

See docs/design.md for how the wings stack."""
