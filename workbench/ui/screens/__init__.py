"""Screens: the live run and its modals (nudge, question, help, error, event list and detail); review mode's
session list and session review."""
