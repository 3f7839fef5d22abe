"""The world a trial runs in: the virtual clock, the tool boundary and its fault injector,
substrates, tool definitions, and the oracle that judges from ground truth.

See docs/design.md for how the wings stack."""
