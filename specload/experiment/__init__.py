"""``specload experiment``: a baseline server and its speculative twins, started, checked, swept and compared
in one command.

An entry-point-level package (the "app" layer, like cli, launch and demo): it starts servers and sweeps, so
it may import every layer below it. ``plan`` reads the experiment's TOML, ``servers`` owns the server
processes, ``smoke`` asks a fresh server whether its speculation is active, ``record`` is experiment.json
(secrets scrubbed), ``run`` is the loop and the comparison. docs/experiment.md is the user's account.
"""
