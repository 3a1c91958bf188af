"""Micro-benchmarks of jdqn components (run on the GPU machine; never asserted in tests)."""
