"""A walk-forward run: placement over devices and processes, memory, checkpoints, the run
directory, faults, termination, logs and reports."""
