"""``jdqn bench``: the jit-compiled benchmark (docs/design.md §15); never timed in tests."""
