"""The export center: a static page shipped in the package, a client of the public API (SPEC §17)."""
