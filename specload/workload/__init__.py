"""What a sweep sends: the scenario and its one field table (``config``), arrival processes, length
distributions, datasets, prompts and their vocabulary, and each request's content (``request``).

Layer 2: imports ``specload.core`` and ``specload.client`` (to ask the server for its tokenizer).
"""
