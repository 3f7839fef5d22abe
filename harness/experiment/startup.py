"""Imported first by `cli.py`, for its side effect: when this process is the `atomix`
command, SIGINT/SIGTERM during the (slow) imports that follow end it with one line and exit
130/143 instead of a traceback (`harness.experiment.interrupts.install_startup_handlers`)."""

from harness.experiment.interrupts import install_startup_handlers

install_startup_handlers()
