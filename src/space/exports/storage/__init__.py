"""Where result bytes live. The ledger row says which execution is published; a store only keeps its bytes.

`protocol` is the small interface every store implements (`ResultStore`, addressed by `ResultKey`);
`postgres.PgResultStore` keeps the chunks in `export_chunks`, so "completed" and "the bytes exist" sit in one
database; `s3.S3ResultStore` keeps one object per execution in an S3-compatible bucket (SPEC §15). `chunks.ChunkWriter`
cuts a run's byte stream into a store's chunks, and `factory.open_result_store` picks the store the settings name,
for the API, the worker and the CLI alike.

Nothing is imported here: each module imports the protocol, and the package must not import them back.
"""
