"""Runtime tests: helpers live in ``runtime_helpers`` (a plain module, imported by name)."""
