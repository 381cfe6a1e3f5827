"""run.json's ``scenario`` typed by the one field table (``Scenario``), for the readers above core.

run.json's schema lives in specload.core.rundir, below the layer that defines the scenario's fields, so
``RunMeta.scenario`` holds the resolved scenario as written (``Scenario.to_dict``) and this module
reads it back as a ``Scenario``: every reader gets typed fields, none repeats the field list.
"""

from __future__ import annotations

from specload.core.rundir import RunMeta, lenient
from specload.workload.config import Scenario


def recorded_scenario(meta: RunMeta) -> Scenario | None:
    """The scenario the run was made with; None when run.json recorded none (another tool's results, a
    hand-made directory).

    Each field is read on its own (``rundir.lenient``): one an older specload did not record reads as
    its default, which is what that specload ran with; a value that does not fit its type reads as
    the default too, and keys no longer in the table are ignored. The table's own checks are not run:
    they judge a sweep about to start, not one that already ran.
    """
    return lenient(Scenario, meta.scenario) if meta.scenario else None
