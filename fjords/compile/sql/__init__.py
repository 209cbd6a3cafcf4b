"""The small SQL dialect: grammar, syntax tree and parser."""
