"""Operations (SPEC §16): readiness, Prometheus metrics and structured, redacted logs."""
