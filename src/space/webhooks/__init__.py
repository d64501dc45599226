"""Webhooks: per-org endpoints told when an export completes or fails and when the org's deletion is requested."""
