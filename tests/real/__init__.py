"""Tests against a real llama.cpp server (make test-real); not collected by plain pytest."""
