"""The `coral` command line: one module per verb, presentation only."""
