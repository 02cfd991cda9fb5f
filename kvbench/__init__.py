"""kvbench: benchmark and comparison harness for KV-cache compression."""
