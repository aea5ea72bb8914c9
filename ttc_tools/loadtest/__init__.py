"""Load testing of a running ttc service (``ttc loadtest``) and of peer proxies (``ttc bench peers``).

Public surface:

* :func:`load_problems` / :class:`Problem` — problem and replay files as (question, gold) pairs.
* :func:`require_loopback` — refuse any target that is not on this machine.
* :func:`poisson_arrivals` — open-loop arrival times.
* :func:`run_level` / :class:`LevelSpec` / :class:`RequestRecord` — drive one policy at one load level.
* :func:`summarize` / :class:`LevelSummary` — percentiles (HdrHistogram), throughput, accuracy with a
  bootstrap interval.
* :func:`write_reports` — table, JSON, CSV, PNG plots and a self-contained HTML report.
"""

from ttc_tools.loadtest.arrivals import poisson_arrivals
from ttc_tools.loadtest.data import Problem, load_problems
from ttc_tools.loadtest.runner import LevelSpec, RequestRecord, run_level
from ttc_tools.loadtest.stats import LevelSummary, summarize
from ttc_tools.loadtest.target import require_loopback

__all__ = [
    "LevelSpec",
    "LevelSummary",
    "Problem",
    "RequestRecord",
    "load_problems",
    "poisson_arrivals",
    "require_loopback",
    "run_level",
    "summarize",
]
