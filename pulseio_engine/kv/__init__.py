"""Paged KV: host-side block bookkeeping (no torch) and the device cache."""
