"""The control plane: the warehouse's own record of generations, fences, writes and events."""
