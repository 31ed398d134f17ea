"""Benchmarks: each runs gpupool and a baseline in the same process and reports both."""
