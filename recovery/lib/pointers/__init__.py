"""Namespaces, the public pointer and the managed views over it, adoption and the BI read copy."""
