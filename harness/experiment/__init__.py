"""Running experiments: configs, overrides, the runner and its executors, run directories,
one trial, interrupts and the typed trial record.

See docs/design.md for how the wings stack."""
