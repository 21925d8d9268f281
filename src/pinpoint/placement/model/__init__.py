"""placement.json as types: the typed model every reader of a run folder uses, its sections and
records, the schema's helpers and the files that hold it."""
