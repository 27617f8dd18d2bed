"""Provenance guards on candidate code: static AST checks before it runs, module checks while it runs."""

from workbench.evaluator.guards.runtime import forbidden_modules
from workbench.evaluator.guards.static import Finding, check_static

__all__ = ["Finding", "check_static", "forbidden_modules"]
