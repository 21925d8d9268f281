"""Memory per device: measured from the allocator's events (`measured`); replayed from the
executed graphs (`from_trace` builds the replay; `nodes`, `schedule`, `simulation` and `replay` run
it); predicted at another batch (`batch`) and checked against a GPU's memory (`fit`). `section`
assembles placement.json's memory section, `calls` separates several calls, `tasks` reads the
serving tasks' figures."""
