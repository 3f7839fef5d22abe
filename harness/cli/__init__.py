"""The `atomix` command line, one module per command group; `cli.py` assembles the app.

This is the top wing: it may import every other wing, and none may import it. Its modules
parse options and print; the work is done by the wings below. Anything heavy (pydantic,
scipy, matplotlib, pandas) is imported inside the commands, so that `atomix --help` and
`--version` stay fast.
"""
