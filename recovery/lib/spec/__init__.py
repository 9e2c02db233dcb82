"""The dataset spec: its models, the hardened YAML loader and the checks of a spec against the warehouse."""
