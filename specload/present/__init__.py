"""Figures -> what people and machines read: the report, the comparison, tables fitted to a terminal,
CSV/JSON, PNG plots, the progress line and the web page's JSON.

Layer 5: imports every layer below (core, client, workload, analysis, sweep); nothing of Locust.
"""
