"""``python -m specload.sim``: same as ``specload sim``."""

from specload.sim.server import main

raise SystemExit(main())
