"""``jdqn bench``: the jit-compiled benchmark (docs/design.md §14); never timed in tests."""
