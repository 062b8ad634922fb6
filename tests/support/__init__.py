"""Helpers shared by several test files (never collected as tests)."""
