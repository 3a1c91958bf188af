"""The walk-forward command at the CI-sized profile (the command's own default is ``default``)."""

SMOKE = ("walkforward", "--profile=smoketest")
