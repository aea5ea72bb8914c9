"""Demo task for the tiny local model: graded multi-step integer arithmetic (see :mod:`ttc_tools.demo.problems`)."""
