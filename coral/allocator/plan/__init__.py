"""The plan file: its format, its decoded instances and its check.

- `decode`: an allocation decoded into plan-file rows.
"""
