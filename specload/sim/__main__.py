"""``python -m specload.sim``: same as ``specload sim``."""

from specload.sim.cli import main

raise SystemExit(main())
