"""The generation-aware write path: the writer, incremental ingestion and a user's asset output."""
