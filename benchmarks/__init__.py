"""Research probes of jdqn's speed (run from the repository root: ``python -m benchmarks.NAME``).

Not part of the product: jdqn never imports from here. ``jdqn bench`` is the product's benchmark.
"""
