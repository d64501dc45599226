"""Schedules (SPEC §21): an owner's or admin's export made again every hour, day or week, optionally incremental."""
