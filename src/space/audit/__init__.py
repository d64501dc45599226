"""The audit trail: who did what to an org's data and when, append-only (SPEC §12)."""
