"""Local mode: `dam run` and `dam evaluate`, no cluster needed."""
