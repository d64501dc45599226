"""Restore (SPEC §23): an archive of schemaVersion 2 uploaded, validated whole, then brought back as a new
organization in one transaction, and verified by writing its data files again and comparing digests."""
