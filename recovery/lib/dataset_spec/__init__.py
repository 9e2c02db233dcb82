"""The dataset spec: its models and hardened YAML loader, durations, SQL files, partition filters, sensitive lineage."""
