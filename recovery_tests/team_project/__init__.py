"""A platform team's own Dagster project, as a user of the package would have it.

Sensor readings arrive in a change log (``raw.readings``); ``clean/readings`` is a
daily-partitioned asset written with dagster-duckdb and stamped with the run id;
``marts/sensor_daily`` aggregates it. Nothing here imports the package except where the
team switches its IO manager to ``ManagedDuckDBIOManager`` during an incident, as the
package's docs ask. ``build.py`` runs a real, failing asset backfill of it through the
Dagster daemon; ``truth.py`` computes what the damage is, independently of the package.
"""
