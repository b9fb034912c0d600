"""Profile types, built-in catalogs transcribed from the papers, and fitting helpers."""
