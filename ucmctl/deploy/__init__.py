"""Bringing a Plan up on its nodes, and down again: executors, lifecycle, state."""
