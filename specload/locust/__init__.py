"""Everything that knows Locust: the event listeners, the user, the shape, the sweep's owner, the
messages between processes, the options and the web UI tab.

Nothing outside this package imports Locust; the rest of specload (records, metrics, reports, the
simulator) works without it. Importing this package itself imports nothing: the locustfile picks
the modules it needs.
"""
