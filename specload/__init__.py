"""specload: Locust-based load testing for LLM inference servers."""

__version__ = "0.1.0"
