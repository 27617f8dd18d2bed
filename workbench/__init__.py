"""Kernel Workbench: long-horizon agentic GPU-kernel optimisation in the terminal."""

__version__ = "0.1.0"
