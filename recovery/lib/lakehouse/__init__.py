"""Delta Lake and Apache Iceberg tables as a dataset's source and target.

The package's DuckDB file stays the engine that computes and the control plane; a
lakehouse table enters the model through its own commit log: every commit becomes
a write of the package's write log (``history``), the source is read as a view over
its current data files (``files``), containment records the fence on the table
itself, and publish is one commit on the table (``commits``). Nothing is imported
here: ``recovery.lib.dataset_spec.models`` imports ``recovery.lib.dataset_spec.lakehouse`` without loading the formats.
"""
