"""Widgets of the workbench screens, one per module."""
