"""The paper's tables as data and the reproduction that sets our cells beside them.

See docs/design.md for how the wings stack."""
