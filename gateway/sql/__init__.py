"""The one reader of SQL (PostgreSQL's own parser) and the binding of values to it."""
from .binding import Template, literal
from .reader import (
    MAX_DEPTH,
    MAX_SQL,
    Statement,
    paged,
    parse_tree,
    placeholders,
    read,
    read_positional,
    write_op,
)
from .trees import shape

__all__ = ["Statement", "Template", "literal", "read", "read_positional", "paged", "placeholders", "parse_tree",
           "shape", "write_op", "MAX_SQL", "MAX_DEPTH"]
