"""Settlement mechanisms behind one interface: the mode interface, the one registry of modes,
Atomix's transactional modes and ablations, and the lock manager the locking baselines share.

See docs/design.md for how the wings stack."""
