"""Apps for the UI tests, built with the same make_app the CLI uses, driven by a replaying fake runtime."""
