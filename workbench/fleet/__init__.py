"""Evaluation slots: many evaluations in flight (one per GPU, on this host or across hosts), one journal writer."""
