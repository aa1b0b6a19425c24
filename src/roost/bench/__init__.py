"""Benchmark harnesses that reuse decide/ and the real services."""
