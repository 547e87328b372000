"""Thin Lambda handlers, one module per function family (see stepwise.functions)."""
