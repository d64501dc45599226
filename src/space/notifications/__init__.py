"""Notifications (SPEC §19): people are told in the app and by email; telling them never changes what they are told about."""
