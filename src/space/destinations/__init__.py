"""Destinations (SPEC §22): an org's own S3-compatible buckets, and exports delivered into them."""
