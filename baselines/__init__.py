"""The settlement mechanisms Atomix is compared against, one module each."""
