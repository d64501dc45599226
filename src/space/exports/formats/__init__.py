"""The export kinds' output formats: `base` (what they share), one module per kind (`snapshot`, `tickets_csv`,
`archive`: its request, its format and how the worker opens it), and `registry`, one row per kind.

Nothing is imported here: the modules import `base`, and the package must not import them back.
"""
