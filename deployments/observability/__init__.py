"""Logs, metrics, traces and profiling, set up once per replica."""
